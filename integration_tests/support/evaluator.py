"""Helpers for evaluator tests: the shipped example tasks, patches made with the host's git, and evaluation
services whose runtimes see the repository on ``PYTHONPATH``.

Run as a script (``python -m integration_tests.support.evaluator CASE.json``) it evaluates one case in a fresh
service and prints the result as JSON: the red-team tests use it to run the evaluator as another host user.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evaluator.app import evaluator_config
from evaluator.convert import evaluator_spec_from_proto
from evaluator.core import EvaluatorService
from evaluator.models import Artifacts, EvaluationResult, EvaluatorSpec, PrepareParams
from evaluator.settings import EvaluatorSettings
from polar_client import load_task
from runtimes import DefaultRuntimeFactory, Runtime, RuntimeSpec

__all__ = [
    "EXAMPLE_TASKS_DIR",
    "EditableFactory",
    "editable_service",
    "evaluate_once",
    "example_names",
    "example_spec",
    "make_patch",
    "run_case",
]

EXAMPLE_TASKS_DIR = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def example_names() -> list[str]:
    """Names of the shipped example tasks."""
    return sorted(p.parent.name for p in EXAMPLE_TASKS_DIR.glob("*/task.yaml"))


def example_spec(name: str) -> tuple[EvaluatorSpec, bytes]:
    """The evaluator spec of an example task and its reference fix."""
    task_dir = EXAMPLE_TASKS_DIR / name
    spec = evaluator_spec_from_proto(load_task(task_dir / "task.yaml").evaluator)
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


class EditableFactory(DefaultRuntimeFactory):
    """Runtimes whose ``PYTHONPATH`` holds the repository, as an editable install does in every SWE-bench image.

    Args:
        base_dir: Parent of the session directories.
        extra_env: More environment for every command (as an image could set), over ``PYTHONPATH``.
        site_dirs: Host directories of installed packages, after the repository on ``PYTHONPATH`` and readable
            in the sandbox (for a Python whose own ``site-packages`` lacks pytest).
    """

    def __init__(
        self, base_dir: Path, extra_env: Mapping[str, str] | None = None, *, site_dirs: Sequence[Path] = ()
    ) -> None:
        super().__init__(base_dir=base_dir)
        self.extra_env = dict(extra_env or {})
        self.site_dirs = tuple(site_dirs)

    def create(self, spec: RuntimeSpec, *, session_id: str) -> Runtime:
        repo = (self.base_dir / session_id).absolute() / "repo"
        path = os.pathsep.join([str(repo), *map(str, self.site_dirs)])
        env = {**spec.env, "PYTHONPATH": path, **self.extra_env}
        read_only = (*spec.read_only_paths, *self.site_dirs)
        return super().create(dataclasses.replace(spec, env=env, read_only_paths=read_only), session_id=session_id)


def editable_service(
    root: Path, extra_env: Mapping[str, str] | None = None, *, site_dirs: Sequence[Path] = (), **settings: Any
) -> EvaluatorService:
    """An evaluation service with state in ``root/state`` and :class:`EditableFactory` runtimes in ``root/rt``."""
    config = evaluator_config(EvaluatorSettings(state_dir=root / "state", **settings))
    return EvaluatorService(config, runtime_factory=EditableFactory(root / "rt", extra_env, site_dirs=site_dirs))


async def evaluate_once(svc: EvaluatorService, spec: EvaluatorSpec, patch: bytes | None) -> EvaluationResult:
    """Prepare ``spec`` and evaluate ``patch`` in it."""
    handle = await svc.prepare(PrepareParams(spec=spec, task_id="redteam"))
    return await svc.evaluate(handle, Artifacts(patch=patch))


async def run_case(case: Mapping[str, Any]) -> EvaluationResult:
    """Evaluate one case in a fresh service and close it.

    Args:
        case: ``root`` (a directory for state and runtimes), ``strategy`` and ``options`` (the spec), ``patch``
            (a file holding the patch, or null), ``settings`` (evaluator settings), ``extra_env`` and
            ``site_dirs`` (:class:`EditableFactory`).
    """
    svc = editable_service(
        Path(case["root"]),
        case.get("extra_env"),
        site_dirs=[Path(p) for p in case.get("site_dirs", ())],
        **case.get("settings", {}),
    )
    patch = await asyncio.to_thread(Path(case["patch"]).read_bytes) if case.get("patch") else None
    try:
        return await evaluate_once(svc, EvaluatorSpec(case["strategy"], case["options"]), patch)
    finally:
        await svc.close()


def main() -> None:
    """Script entry: ``evaluator CASE.json`` prints the result of :func:`run_case` as JSON."""
    case = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    print(json.dumps(asyncio.run(run_case(case)).to_dict()))


if __name__ == "__main__":
    main()
