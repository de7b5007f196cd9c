"""Every protobuf ↔ domain conversion of the evaluator (``polar.evaluator.v1`` ↔ :mod:`evaluator.models`)."""

from __future__ import annotations

from google.protobuf import json_format
from polar.common.v1 import task_pb2
from polar.evaluator.v1 import evaluator_service_pb2 as pb

from evaluator.models import Artifacts, EvaluationResult, EvaluatorSpec, PrepareParams, TestStatus
from polar_core.convert import status_to_proto, trace_from_proto
from polar_core.durations import duration, seconds
from polar_core.errors import InvalidArgument
from polar_core.records import AgentStatus

__all__ = [
    "agent_status_from_proto",
    "artifacts_from_proto",
    "evaluator_spec_from_proto",
    "prepare_params_from_proto",
    "result_to_proto",
    "timeout_from_proto",
]

_AGENT_STATUS: dict[int, AgentStatus] = {
    pb.AGENT_STATUS_UNSPECIFIED: AgentStatus.COMPLETED,
    pb.AGENT_STATUS_COMPLETED: AgentStatus.COMPLETED,
    pb.AGENT_STATUS_TIMEOUT: AgentStatus.TIMEOUT,
    pb.AGENT_STATUS_ERROR: AgentStatus.ERROR,
    pb.AGENT_STATUS_CANCELLED: AgentStatus.CANCELLED,
}
_TEST_STATUS = {
    TestStatus.PASSED: pb.TEST_OUTCOME_STATUS_PASSED,
    TestStatus.FAILED: pb.TEST_OUTCOME_STATUS_FAILED,
    TestStatus.ERROR: pb.TEST_OUTCOME_STATUS_ERROR,
    TestStatus.SKIPPED: pb.TEST_OUTCOME_STATUS_SKIPPED,
    TestStatus.MISSING: pb.TEST_OUTCOME_STATUS_MISSING,
}


def agent_status_from_proto(value: int) -> AgentStatus:
    """The :class:`AgentStatus` of an ``AgentStatus`` enum value; unknown values count as completed."""
    return _AGENT_STATUS.get(value, AgentStatus.COMPLETED)


def evaluator_spec_from_proto(spec: task_pb2.EvaluatorSpec) -> EvaluatorSpec:
    """Convert a task's ``EvaluatorSpec`` (as ``polar_client.load_task`` reads it from a task file).

    Raises:
        InvalidArgument: It names no strategy.
    """
    if not spec.strategy:
        raise InvalidArgument("evaluator.strategy is required")
    return EvaluatorSpec(strategy=spec.strategy, options=json_format.MessageToDict(spec.options))


def prepare_params_from_proto(request: pb.PrepareRequest) -> PrepareParams:
    """Convert a ``PrepareRequest``.

    Raises:
        InvalidArgument: The request names no strategy.
    """
    return PrepareParams(
        spec=evaluator_spec_from_proto(request.evaluator),
        task_id=request.task_id,
        session_id=request.session_id,
        repository_snapshot=request.repository_snapshot,
        image=request.image,
        metadata=json_format.MessageToDict(request.metadata),
        request_id=request.request_id,
    )


def timeout_from_proto(request: pb.EvaluateRequest) -> float | None:
    """The ``timeout`` of an ``EvaluateRequest`` in seconds, or ``None`` when it is unset."""
    return seconds(request.timeout) if request.HasField("timeout") else None


def artifacts_from_proto(msg: pb.EvaluationArtifacts) -> Artifacts:
    """Convert ``EvaluationArtifacts``."""
    which = msg.WhichOneof("patch")
    patch: bytes | None = None
    if which == "patch_bytes":
        patch = bytes(msg.patch_bytes)
    elif which == "patch_text":
        patch = msg.patch_text.encode("utf-8")
    files = {}
    for item in msg.files:
        if not item.path:
            raise InvalidArgument("an artifact file has no path")
        files[item.path] = bytes(item.content)
    return Artifacts(
        patch=patch,
        files=files,
        agent_status=agent_status_from_proto(msg.agent_status),
        traces=tuple(trace_from_proto(t) for t in msg.traces),
    )


def result_to_proto(result: EvaluationResult) -> pb.EvaluateResponse:
    """Convert an :class:`EvaluationResult` to ``EvaluateResponse``."""
    response = pb.EvaluateResponse(
        reward=result.reward,
        terminal_status=status_to_proto(result.status),
        trace_rewards=list(result.trace_rewards),
        log_ref=result.log_ref,
        error_message=result.error_message,
        duration=duration(result.duration_s),
    )
    for outcome in result.test_outcomes:
        response.test_outcomes.add(
            test_id=outcome.test_id, outcome=_TEST_STATUS[outcome.status], duration=duration(outcome.duration_s)
        )
    return response
