"""gRPC servicer of ``polar.evaluator.v1.EvaluatorService``: protobuf <-> dataclasses, nothing more.

Errors are raised as :mod:`polar_core.errors` classes; the server's interceptor maps them to status codes.
An evaluation that runs past its timeout is answered with ``TERMINAL_STATUS_EVAL_TIMEOUT`` in a normal
response (rather than ``DEADLINE_EXCEEDED``), so the stored, idempotent result reaches the caller.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from polar.evaluator.v1 import evaluator_service_pb2 as pb
from polar.evaluator.v1 import evaluator_service_pb2_grpc as pb_grpc

from evaluator.models import AgentStatus, Artifacts, EvaluationResult, EvaluatorSpec, PrepareParams, TestStatus
from evaluator.service import EvaluatorService
from polar_core.convert import status_to_proto, trace_from_proto
from polar_core.errors import InvalidArgument

__all__ = ["EvaluatorServicer"]

_AGENT_STATUS = {
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


def artifacts_from_proto(msg: Any) -> Artifacts:
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
        agent_status=_AGENT_STATUS.get(msg.agent_status, AgentStatus.COMPLETED),
        traces=tuple(trace_from_proto(t) for t in msg.traces),
    )


def result_to_proto(result: EvaluationResult) -> Any:
    """Convert an :class:`EvaluationResult` to ``EvaluateResponse``."""
    response = pb.EvaluateResponse(
        reward=result.reward,
        terminal_status=status_to_proto(result.status),
        trace_rewards=list(result.trace_rewards),
        log_ref=result.log_ref,
        error_message=result.error_message,
    )
    response.duration.FromNanoseconds(int(result.duration_s * 1e9))
    for outcome in result.test_outcomes:
        item = response.test_outcomes.add(test_id=outcome.test_id, outcome=_TEST_STATUS[outcome.status])
        item.duration.FromNanoseconds(int(outcome.duration_s * 1e9))
    return response


class EvaluatorServicer(pb_grpc.EvaluatorServiceServicer):  # type: ignore[misc]
    """Serves an :class:`EvaluatorService`.

    Args:
        service: The domain service (its owner closes it on shutdown).
    """

    def __init__(self, service: EvaluatorService) -> None:
        self._service = service

    async def Prepare(self, request: Any, context: Any) -> Any:
        """Prepare an evaluation; see the proto."""
        options = json_format.MessageToDict(request.evaluator.options) if request.HasField("evaluator") else {}
        if not request.evaluator.strategy:
            raise InvalidArgument("evaluator.strategy is required")
        params = PrepareParams(
            spec=EvaluatorSpec(strategy=request.evaluator.strategy, options=options),
            task_id=request.task_id,
            session_id=request.session_id,
            repository_snapshot=request.repository_snapshot,
            image=request.image,
            metadata=json_format.MessageToDict(request.metadata),
            request_id=request.request_id,
        )
        return pb.PrepareResponse(handle=await self._service.prepare(params))

    async def Evaluate(self, request: Any, context: Any) -> Any:
        """Evaluate artifacts; see the proto."""
        if not request.handle:
            raise InvalidArgument("handle is required")
        timeout_s = request.timeout.ToNanoseconds() / 1e9 if request.HasField("timeout") else None
        result = await self._service.evaluate(
            request.handle, artifacts_from_proto(request.artifacts), timeout_s=timeout_s
        )
        return result_to_proto(result)

    async def Release(self, request: Any, context: Any) -> Any:
        """Release an evaluation; see the proto."""
        return pb.ReleaseResponse(released=await self._service.release(request.handle))
