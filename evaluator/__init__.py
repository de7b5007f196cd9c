"""The evaluator: scores what an agent produced in a clean runtime it could not tamper with.

See docs/evaluator.md. The gRPC servicer is :mod:`evaluator.servicer`; the domain service is
:class:`evaluator.service.EvaluatorService`.
"""

from __future__ import annotations

from evaluator.errors import HandleNotFound, InvalidOptions, UnknownStrategy
from evaluator.models import (
    AgentStatus,
    Artifacts,
    EvaluationResult,
    EvaluatorSpec,
    PrepareParams,
    TestOutcome,
    TestStatus,
)
from evaluator.service import EvaluatorService
from evaluator.settings import EvaluatorSettings
from evaluator.strategies import CustomEvaluation, CustomResult
from evaluator.task_files import evaluator_spec_from_task, load_task_file

__all__ = [
    "AgentStatus",
    "Artifacts",
    "CustomEvaluation",
    "CustomResult",
    "EvaluationResult",
    "EvaluatorService",
    "EvaluatorSettings",
    "EvaluatorSpec",
    "HandleNotFound",
    "InvalidOptions",
    "PrepareParams",
    "TestOutcome",
    "TestStatus",
    "UnknownStrategy",
    "evaluator_spec_from_task",
    "load_task_file",
]
