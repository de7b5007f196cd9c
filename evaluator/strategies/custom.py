"""Custom evaluators by import path (``module:callable``).

The callable gets a :class:`CustomEvaluation` and returns a float (the reward), a :class:`CustomResult`
(reward, optional resolved flag, optional per-trace rewards) or an :class:`EvaluationResult`; it may be a
coroutine function. When the task names a repository, it is prepared in a clean runtime as for ``swe``
(the patch is *not* applied: the callable decides what to do with the artifacts). An exception raised by
the callable is an evaluator crash: ``infra_error``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from evaluator.errors import InvalidOptions, UnknownStrategy
from evaluator.models import Artifacts, EvaluationResult
from evaluator.strategies.base import EvalContext, prepare_repository
from evaluator.trace_rewards import trace_rewards_from_calls
from polar_core.records import TerminalStatus
from runtimes import Runtime

__all__ = ["CustomEvaluation", "CustomResult", "CustomStrategy", "load_callable"]


@dataclasses.dataclass(frozen=True)
class CustomEvaluation:
    """What a custom evaluator gets.

    Attributes:
        artifacts: The agent's artifacts (patch, files, agent status, traces).
        options: The evaluator options from the task file.
        metadata: The task's metadata.
        runtime: A clean runtime with the repository at ``repo_dir``, when the task names one.
        repo_dir: The repository inside the runtime.
        log_path: The evaluation log on the host (append to it freely).
    """

    artifacts: Artifacts
    options: Mapping[str, Any]
    metadata: Mapping[str, Any]
    runtime: Runtime | None
    repo_dir: PurePosixPath | None
    log_path: Path


@dataclasses.dataclass(frozen=True)
class CustomResult:
    """A custom evaluator's verdict; ``resolved`` defaults to ``reward >= 1.0``.

    Per-trace rewards come as ``trace_rewards`` (one per trace, by ``trace_index``) or ``call_rewards`` (call id
    to reward; a trace gets the sum over its calls, see :mod:`evaluator.trace_rewards`), never both; both need
    the traces, which the evaluator gets when the task sets ``needs_traces: true``.
    """

    reward: float
    resolved: bool | None = None
    trace_rewards: tuple[float, ...] = ()
    call_rewards: Mapping[str, float] = dataclasses.field(default_factory=dict)


def load_callable(path: str) -> Callable[..., Any]:
    """Import ``module:attr.attr``; raises :class:`UnknownStrategy` when it does not resolve."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise UnknownStrategy(f"custom evaluator {path!r} is not 'module:callable'")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise UnknownStrategy(f"cannot import custom evaluator {path!r}: {exc}") from None
    if not callable(obj):
        raise UnknownStrategy(f"custom evaluator {path!r} is not callable")
    return obj  # type: ignore[no-any-return]


class CustomStrategy:
    """Runs a user callable."""

    def __init__(self, path: str, options: Mapping[str, Any]) -> None:
        self.func = load_callable(path)
        self.needs_runtime = bool(options.get("repo") or options.get("repo_path") or options.get("runtime"))

    async def prepare(self, ctx: EvalContext) -> None:
        """Prepare the repository when there is one."""
        source = ctx.params.repository_snapshot or ctx.options.get("repo") or ""
        if ctx.runtime is not None and (source or ctx.options.get("repo_path")):
            await prepare_repository(ctx, Path(source) if source else None)

    async def evaluate(self, ctx: EvalContext, artifacts: Artifacts) -> EvaluationResult:
        """Call the user's function and normalise what it returns."""
        request = CustomEvaluation(
            artifacts=artifacts,
            options=ctx.options,
            metadata=ctx.params.metadata,
            runtime=ctx.runtime,
            repo_dir=ctx.repo_dir,
            log_path=ctx.log.path,
        )
        value = self.func(request)
        if inspect.isawaitable(value):
            value = await value
        if isinstance(value, EvaluationResult):
            return value
        if isinstance(value, CustomResult):
            resolved = value.resolved if value.resolved is not None else value.reward >= 1.0
            status = TerminalStatus.RESOLVED if resolved else TerminalStatus.UNRESOLVED
            rewards = tuple(value.trace_rewards)
            if value.call_rewards:
                if rewards:
                    raise InvalidOptions("custom evaluator returned both trace_rewards and call_rewards")
                rewards = trace_rewards_from_calls(artifacts.traces, value.call_rewards)
            return EvaluationResult(value.reward, status, trace_rewards=rewards)
        if isinstance(value, int | float) and not isinstance(value, bool):
            status = TerminalStatus.RESOLVED if value >= 1.0 else TerminalStatus.UNRESOLVED
            return EvaluationResult(float(value), status)
        raise InvalidOptions(f"custom evaluator returned {type(value).__name__}, not a reward")
