"""One evaluation's environment as strategies see it: :class:`EvalContext`, and :class:`EvalTimeout`.

It sits below :mod:`evaluator.ports` (whose ``Strategy`` protocol takes it) and the strategies (which use it),
and imports neither, so the seam and its argument type form no import cycle.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from evaluator.evallog import EvalLog
from evaluator.models import PrepareParams
from runtimes import ExecResult, Runtime, RuntimeDied

__all__ = ["EvalContext", "EvalTimeout"]

# git with a fixed identity, no signing and no hooks (the repository's hooks are the agent's).
_GIT = ["git", "-c", "user.name=polar", "-c", "user.email=polar@localhost", "-c", "commit.gpgsign=false",
        "-c", "core.hooksPath=/dev/null"]  # fmt: skip


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
