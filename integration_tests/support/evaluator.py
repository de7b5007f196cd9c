"""Helpers for evaluator tests: the shipped example tasks and patches made with the host's git."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from evaluator.models import EvaluatorSpec
from evaluator.task_files import evaluator_spec_from_task, load_task_file

__all__ = ["EXAMPLE_TASKS_DIR", "example_names", "example_spec", "make_patch"]

EXAMPLE_TASKS_DIR = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def example_names() -> list[str]:
    """Names of the shipped example tasks."""
    return sorted(p.parent.name for p in EXAMPLE_TASKS_DIR.glob("*/task.yaml"))


def example_spec(name: str) -> tuple[EvaluatorSpec, bytes]:
    """The evaluator spec of an example task and its reference fix."""
    task_dir = EXAMPLE_TASKS_DIR / name
    spec = evaluator_spec_from_task(load_task_file(task_dir / "task.yaml"), task_dir)
    return spec, (task_dir / "fix.patch").read_bytes()


def make_patch(repo: Path, changes: Mapping[str, str | None], *, base_patch: bytes = b"") -> bytes:
    """A git diff that turns ``repo`` (after ``base_patch``) into ``repo`` with ``changes`` applied.

    Args:
        repo: The original repository folder.
        changes: New contents by relative path; ``None`` deletes the file.
        base_patch: A patch applied first and included in the result (e.g. the reference fix).
    """
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(repo, work, ignore=shutil.ignore_patterns(".git", "__pycache__"))
        subprocess.run([*git, "init", "-q"], cwd=work, check=True)
        subprocess.run([*git, "add", "-A"], cwd=work, check=True)
        subprocess.run([*git, "commit", "-qm", "base"], cwd=work, check=True)
        if base_patch:
            subprocess.run([*git, "apply", "-"], cwd=work, input=base_patch, check=True)
        for rel, content in changes.items():
            target = work / rel
            if content is None:
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(content, encoding="utf-8")
        subprocess.run([*git, "add", "-A"], cwd=work, check=True)
        out = subprocess.run([*git, "diff", "--cached", "--binary"], cwd=work, check=True, capture_output=True)
        return out.stdout
