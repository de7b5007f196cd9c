"""Conversions between ``polar.*.v1`` messages and the gateway's plain records.

Only the servicer and the gRPC clients use this module; the pipeline sees dataclasses.
"""

from __future__ import annotations

from google.protobuf import timestamp_pb2
from polar.common.v1 import metrics_pb2, session_pb2, status_pb2, task_pb2
from polar.gateway.v1 import gateway_service_pb2

from gateway.models import (
    BuilderConfig,
    EvaluatorConfig,
    HarnessConfig,
    RuntimeConfig,
    SessionEvent,
    SessionResult,
    SessionSpec,
    SessionState,
    Stage,
)
from gateway.pools import StageSnapshot
from polar_core.convert import (
    completion_from_proto,
    completion_to_proto,
    status_from_proto,
    struct_to_dict,
    trace_from_proto,
    trace_to_proto,
)
from polar_core.convert import status_to_proto as _status_to_proto
from polar_core.errors import InvalidArgument
from polar_core.records import ReconstructionStrategy, TerminalStatus
from reconstructor.convert import stats_to_proto, strategy_from_proto

__all__ = [
    "completion_from_proto",
    "completion_to_proto",
    "event_to_proto",
    "result_to_proto",
    "spec_from_proto",
    "stage_to_proto",
    "state_to_proto",
    "status_from_proto",
    "status_to_proto",
    "struct_to_dict",
    "trace_from_proto",
    "trace_to_proto",
]

_RUNTIME_KINDS = {
    task_pb2.RUNTIME_KIND_UNSPECIFIED: "",
    task_pb2.RUNTIME_KIND_LOCAL: "local",
    task_pb2.RUNTIME_KIND_DOCKER: "docker",
    task_pb2.RUNTIME_KIND_APPTAINER: "apptainer",
}
_STAGES = {
    Stage.INIT: status_pb2.SESSION_STAGE_INIT,
    Stage.READY: status_pb2.SESSION_STAGE_READY,
    Stage.RUNNING: status_pb2.SESSION_STAGE_RUNNING,
    Stage.POSTRUN: status_pb2.SESSION_STAGE_POSTRUN,
    Stage.DONE: status_pb2.SESSION_STAGE_DONE,
}


def _timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def status_to_proto(status: TerminalStatus | None) -> status_pb2.TerminalStatus:
    """Return the enum value of ``status`` (UNSPECIFIED for ``None``)."""
    return status_pb2.TERMINAL_STATUS_UNSPECIFIED if status is None else _status_to_proto(status)


def stage_to_proto(stage: Stage | None) -> status_pb2.SessionStage:
    """Return the enum value of ``stage`` (UNSPECIFIED for ``None``)."""
    return status_pb2.SESSION_STAGE_UNSPECIFIED if stage is None else _STAGES[stage]


def spec_from_proto(message: session_pb2.SessionSpec) -> SessionSpec:
    """Return the session spec of a ``SessionSpec`` message.

    Raises:
        InvalidArgument: A required field is missing or malformed.
    """
    task = message.task
    strategy: ReconstructionStrategy | None = None
    if task.builder.strategy:
        strategy = strategy_from_proto(task.builder.strategy, ReconstructionStrategy.PREFIX_MERGE)
    backend_options = struct_to_dict(task.backend.options)
    try:
        kind = _RUNTIME_KINDS[task.runtime.kind]
    except KeyError:
        raise InvalidArgument(f"unknown runtime kind {task.runtime.kind}") from None
    return SessionSpec(
        session_id=message.session_id,
        task_id=message.task_id or task.task_id,
        sample_index=message.sample_index,
        attempt=message.attempt or 1,
        instruction=task.instruction,
        agent_timeout_s=task.timeout_seconds,
        deadline=message.deadline.ToNanoseconds() / 1e9 if message.HasField("deadline") else None,
        priority=task.priority,
        model=str(backend_options.get("model_name", "")),
        harness=HarnessConfig(task.harness.name, struct_to_dict(task.harness.options)),
        runtime=RuntimeConfig(kind, task.runtime.image, struct_to_dict(task.runtime.options)),
        evaluator=EvaluatorConfig(task.evaluator.strategy, struct_to_dict(task.evaluator.options)),
        builder=BuilderConfig(strategy, tuple(task.builder.end_of_turn_token_ids)),
        metadata=struct_to_dict(task.metadata),
    )


def state_to_proto(state: SessionState) -> session_pb2.SessionState:
    """Return the ``SessionState`` message of a state."""
    return session_pb2.SessionState(
        session_id=state.session_id,
        task_id=state.task_id,
        sample_index=state.sample_index,
        attempt=state.attempt,
        stage=stage_to_proto(state.stage),
        terminal_status=status_to_proto(state.status),
        gateway_id=state.gateway_id,
        stage_entered_at=_timestamp(state.stage_entered_at),
        deadline=_timestamp(state.deadline),
        error_message=state.error_message,
    )


def result_to_proto(result: SessionResult) -> session_pb2.SessionResult:
    """Return the ``SessionResult`` message of a result."""
    statistics = session_pb2.SessionStatistics(
        completions=result.completions,
        prompt_tokens=result.prompt_tokens,
        response_tokens=result.response_tokens,
    )
    if result.reconstruction is not None:
        statistics.reconstruction.CopyFrom(stats_to_proto(result.reconstruction))
    return session_pb2.SessionResult(
        session_id=result.session_id,
        task_id=result.task_id,
        status=result.status.value,
        reward=result.reward,
        traces=[trace_to_proto(t) for t in result.traces],
        timings=dict(result.timings),
        statistics=statistics,
        error_message=result.error_message,
        idempotency_key=result.idempotency_key,
        gateway_id=result.gateway_id,
        attempt=result.attempt,
        terminal_status=status_to_proto(result.status),
        sample_index=result.sample_index,
    )


def event_to_proto(event: SessionEvent) -> gateway_service_pb2.WatchSessionsResponse:
    """Return the ``WatchSessionsResponse`` of an event."""
    out = gateway_service_pb2.WatchSessionsResponse(
        state=state_to_proto(event.state), event_time=_timestamp(event.time)
    )
    if event.previous is not None:
        out.previous_stage = stage_to_proto(event.previous)
    if event.result is not None:
        out.result.CopyFrom(result_to_proto(event.result))
    return out


def snapshot_to_proto(snapshot: StageSnapshot) -> metrics_pb2.StageMetrics:
    """Return the ``StageMetrics`` of a pool snapshot."""
    return metrics_pb2.StageMetrics(
        stage=stage_to_proto(snapshot.stage),
        queue_length=snapshot.queue_length,
        occupancy=snapshot.occupancy,
        workers=snapshot.workers,
    )
