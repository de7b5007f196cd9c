"""The evaluator's seams: the strategy protocol and the runtimes strategies score in.

A strategy (``evaluator.strategies``) is what the evaluation service runs at Prepare and Evaluate; a runtime
(:mod:`runtimes`) is the clean sandbox it runs in, built by a :class:`RuntimeFactory` (tests pass their own).
"""

from __future__ import annotations

from typing import Protocol

from evaluator.eval_context import EvalContext
from evaluator.models import Artifacts, EvaluationResult
from runtimes import Runtime, RuntimeFactory

__all__ = ["Runtime", "RuntimeFactory", "Strategy"]


class Strategy(Protocol):
    """An evaluation strategy. Options are validated when it is built (at Prepare)."""

    @property
    def needs_runtime(self) -> bool:
        """Whether Prepare must start a runtime for this strategy."""
        ...

    async def prepare(self, ctx: EvalContext) -> None:
        """Set up the runtime (copy the repository, build, ...)."""
        ...

    async def evaluate(self, ctx: EvalContext, artifacts: Artifacts) -> EvaluationResult:
        """Score the artifacts; statuses, not exceptions, report the agent's failures."""
        ...
