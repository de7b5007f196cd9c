"""Blocking Hypothesis's pytest plugin where nothing mentions it (the command rewrite; the grep runs for real)."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from evaluator.strategies.unused_plugins import mentions_hypothesis_argv, without_unused_plugins
from runtimes import ExecResult

ARGV = ["python", "-P", "-m", "pytest", "-p", "no:cacheprovider", "-rA", "tests/test_a.py"]


@dataclasses.dataclass
class HostContext:
    """The part of an EvalContext the rewrite uses: commands run on the host in ``repo_dir``."""

    repo_dir: PurePosixPath

    async def run(self, argv: Sequence[str], *, cwd: PurePosixPath | None = None, **_: Any) -> ExecResult:
        done = await asyncio.to_thread(subprocess.run, list(argv), cwd=cwd, capture_output=True, text=True, check=False)
        return ExecResult(exit_code=done.returncode, stdout=done.stdout, stderr=done.stderr)


def _repo(tmp_path: Path, files: dict[str, str]) -> Any:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return HostContext(PurePosixPath(tmp_path))  # duck-typed EvalContext


async def test_blocked_when_nothing_mentions_hypothesis(tmp_path: Path) -> None:
    ctx = _repo(tmp_path, {"tests/test_a.py": "def test_a():\n    pass\n", "lib.py": "import hypothesis\n"})
    argv = await without_unused_plugins(ctx, [*ARGV[:6], "-p", "hypothesispytest", *ARGV[6:]], ["tests/test_a.py"])
    assert argv == ["python", "-P", "-m", "pytest", "-p", "no:hypothesispytest", *ARGV[4:]]


@pytest.mark.parametrize(
    "where", ["tests/test_a.py", "conftest.py", "tests/conftest.py", "pytest.ini", "pyproject.toml", "setup.cfg"]
)
async def test_kept_when_the_run_mentions_it(tmp_path: Path, where: str) -> None:
    files = {"tests/test_a.py": "def test_a():\n    pass\n", where: "# uses hypothesis\n"}
    ctx = _repo(tmp_path, files)
    assert await without_unused_plugins(ctx, ARGV, ["tests/test_a.py"]) == ARGV


async def test_other_commands_and_failed_checks_run_as_given(tmp_path: Path) -> None:
    ctx = _repo(tmp_path, {"tests/test_a.py": "def test_a():\n    pass\n"})
    assert await without_unused_plugins(ctx, ["sh", "-c", "pytest"], ["tests/test_a.py"]) == ["sh", "-c", "pytest"]
    missing: Any = HostContext(PurePosixPath(tmp_path / "no-such-dir"))
    with pytest.raises(FileNotFoundError):
        await without_unused_plugins(missing, ARGV, ["tests/test_a.py"])
    assert "--exclude-dir=.git" in mentions_hypothesis_argv(["tests/test_a.py"])
