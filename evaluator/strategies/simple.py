"""The ``session_completed`` strategy: reward 1.0 when the agent finished on its own, else 0.0."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evaluator.models import Artifacts, EvaluationResult
from evaluator.strategies.base import EvalContext
from polar_core.records import AgentStatus, TerminalStatus

__all__ = ["SessionCompletedStrategy"]


class SessionCompletedStrategy:
    """No options; needs no runtime."""

    needs_runtime = False

    def __init__(self, options: Mapping[str, Any]) -> None:
        del options

    async def prepare(self, ctx: EvalContext) -> None:
        """Nothing to prepare."""

    async def evaluate(self, ctx: EvalContext, artifacts: Artifacts) -> EvaluationResult:
        """Score by the agent status."""
        if artifacts.agent_status is AgentStatus.COMPLETED:
            return EvaluationResult(1.0, TerminalStatus.RESOLVED)
        return EvaluationResult(0.0, TerminalStatus.UNRESOLVED)
