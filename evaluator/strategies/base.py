"""What strategies share: the evaluation context and the repository snapshot (the protocol is ``evaluator.ports``)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from evaluator.errors import InvalidOptions
from evaluator.evallog import EvalLog
from evaluator.models import PrepareParams
from evaluator.ports import Runtime, Strategy
from polar_core.git_trees import TreeCache, is_git_repository
from runtimes import ExecResult, RuntimeDied

__all__ = [
    "EvalContext",
    "EvalTimeout",
    "Strategy",
    "opt_float",
    "opt_str",
    "opt_str_list",
    "prepare_repository",
]

_GIT = ["git", "-c", "user.name=polar", "-c", "user.email=polar@localhost", "-c", "commit.gpgsign=false",
        "-c", "core.hooksPath=/dev/null"]  # fmt: skip
_SNAPSHOT_EXCLUDE = (".git", "__pycache__", ".pytest_cache", "*.pyc")


class EvalTimeout(Exception):
    """A step of the evaluation ran past the evaluation's deadline (reported as eval_timeout)."""


@dataclasses.dataclass
class EvalContext:
    """One evaluation's environment.

    Attributes:
        handle: The evaluation handle.
        params: What Prepare was called with.
        options: The strategy options.
        runtime: The clean runtime, or ``None`` for strategies that need none.
        log: The evaluation log.
        workdir: Host directory of this evaluation's own files (log, reports).
        python: The Python command inside the runtime.
        repo_dir: The repository inside the runtime, once prepared.
        deadline: ``time.monotonic()`` value by which the evaluation must end.
    """

    handle: str
    params: PrepareParams
    options: Mapping[str, Any]
    runtime: Runtime | None
    log: EvalLog
    workdir: Path
    python: str
    repo_dir: PurePosixPath | None = None
    deadline: float = float("inf")

    def remaining(self) -> float:
        """Seconds left before the deadline; raises :class:`EvalTimeout` when none are."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise EvalTimeout("the evaluation ran out of time")
        return left

    def need_runtime(self) -> Runtime:
        """The runtime; a strategy that needs one always has one (checked at Prepare)."""
        if self.runtime is None:
            raise RuntimeDied("this evaluation has no runtime")
        return self.runtime

    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: PurePosixPath | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 120.0,  # noqa: ASYNC109 - capped by the deadline and enforced by the runtime
        check: bool = False,
    ) -> ExecResult:
        """Run a command in the runtime, logged, within the deadline.

        Raises:
            EvalTimeout: The command ran past the evaluation deadline.
            RuntimeDied: ``check`` is set and the command failed (a step of ours, not the agent's).
        """
        limit = min(timeout, self.remaining())
        result = await self.need_runtime().exec(argv, cwd=cwd, env=env, timeout=limit)
        self.log.command(argv, result)
        if result.timed_out:
            if limit < timeout:
                raise EvalTimeout(f"{argv[0]} ran past the evaluation deadline")
            raise EvalTimeout(f"{argv[0]} ran past its {timeout:.0f}s limit")
        if check and result.exit_code != 0:
            raise RuntimeDied(f"{' '.join(argv[:3])} failed (exit {result.exit_code}): {result.stderr[-500:]}")
        return result

    async def git(self, *args: str, check: bool = True) -> ExecResult:
        """Run git in the repository."""
        return await self.run([*_GIT, *args], cwd=self.repo_dir, check=check, timeout=120.0)


async def prepare_repository(ctx: EvalContext, source: Path | None) -> None:
    """Put the repository in the runtime and commit it as a fresh git snapshot.

    The source is copied without its ``.git`` (so no history, e.g. future commits, reaches the runtime): a
    git repository as the tree of ``options["base_commit"]`` (``HEAD`` without one), exported exactly as the
    gateway gave it to the agent, a plain directory as it is. Without a source, ``options["repo_path"]`` names
    a repository already in the image.
    """
    runtime = ctx.need_runtime()
    if source is not None:
        if not await asyncio.to_thread(source.is_dir):
            raise InvalidOptions(f"repository snapshot {source} is not a directory")
        source = await asyncio.to_thread(_base_tree, source, ctx.options.get("base_commit") or "")
        await runtime.upload(source, "repo", exclude=_SNAPSHOT_EXCLUDE)
        ctx.repo_dir = runtime.root / "repo"
    else:
        in_image = ctx.options.get("repo_path")
        if not isinstance(in_image, str) or not in_image:
            raise InvalidOptions("the evaluator needs a repository: options.repo, repo_path or a snapshot")
        ctx.repo_dir = PurePosixPath(in_image)
    await ctx.run(["mkdir", "-p", str(runtime.root / "eval")], check=True)
    probe = await ctx.git("rev-parse", "--is-inside-work-tree", check=False)
    if probe.exit_code != 0 or source is not None:
        await ctx.git("init", "-q")
    await ctx.git("add", "-A")
    await ctx.git("commit", "-q", "--allow-empty", "--no-verify", "-m", "polar: evaluation snapshot")


def _base_tree(source: Path, base_commit: object) -> Path:
    """The directory to copy in: the export of ``base_commit``'s tree for a git repository, else ``source``."""
    if not isinstance(base_commit, str):
        raise InvalidOptions("option 'base_commit' must be a string")
    if not is_git_repository(source) and not base_commit:
        return source
    trees = TreeCache()
    return trees.export(trees.resolve(source, base_commit))


def opt_str(options: Mapping[str, Any], key: str, default: str = "") -> str:
    """A string option."""
    value = options.get(key, default)
    if not isinstance(value, str):
        raise InvalidOptions(f"option {key!r} must be a string")
    return value


def opt_float(options: Mapping[str, Any], key: str, default: float | None) -> float | None:
    """A number option."""
    value = options.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidOptions(f"option {key!r} must be a number")
    return float(value)


def opt_str_list(options: Mapping[str, Any], key: str) -> list[str]:
    """A list-of-strings option (missing means empty)."""
    value = options.get(key, [])
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise InvalidOptions(f"option {key!r} must be a list of strings")
    return list(value)
