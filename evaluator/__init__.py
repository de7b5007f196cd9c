"""The evaluator: scores what an agent produced in a clean runtime it could not tamper with.

See docs/evaluator.md. The domain entry is :class:`evaluator.core.EvaluatorService` (no gRPC);
:mod:`evaluator.servicer` serves it over gRPC, converting with :mod:`evaluator.convert`;
:class:`evaluator.app.EvaluatorApp` builds it from :class:`EvaluatorSettings`, and
:func:`evaluator.server.start_server` starts the whole service.
"""

from __future__ import annotations

from evaluator.app import EvaluatorApp, evaluator_config
from evaluator.core import EvaluatorService
from evaluator.errors import HandleNotFound, InvalidOptions, UnknownStrategy
from evaluator.models import (
    Artifacts,
    EvaluationResult,
    EvaluatorConfig,
    EvaluatorSpec,
    PrepareParams,
    TestOutcome,
    TestStatus,
)
from evaluator.ports import Strategy
from evaluator.settings import EvaluatorSettings
from evaluator.strategies import CustomEvaluation, CustomResult
from polar_core.records import AgentStatus

__all__ = [
    "AgentStatus",
    "Artifacts",
    "CustomEvaluation",
    "CustomResult",
    "EvaluationResult",
    "EvaluatorApp",
    "EvaluatorConfig",
    "EvaluatorService",
    "EvaluatorSettings",
    "EvaluatorSpec",
    "HandleNotFound",
    "InvalidOptions",
    "PrepareParams",
    "Strategy",
    "TestOutcome",
    "TestStatus",
    "UnknownStrategy",
    "evaluator_config",
]
