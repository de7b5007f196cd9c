"""Every conversion between ``polar.*.v1`` messages and the gateway's plain records.

Only the servicer (:mod:`gateway.servicer`) and the gRPC clients (:mod:`gateway.clients`) use this module; the
pipeline sees dataclasses. Enum values come from the generated modules, never as literal ints.
"""

from __future__ import annotations

from collections.abc import Sequence

from polar.common.v1 import metrics_pb2, reconstruction_pb2, session_pb2, status_pb2, task_pb2
from polar.evaluator.v1 import evaluator_service_pb2
from polar.gateway.v1 import gateway_service_pb2
from polar.proxy.v1 import model_proxy_service_pb2
from polar.reconstructor.v1 import reconstructor_service_pb2
from polar.rollout.v1 import rollout_service_pb2

from gateway.models import (
    AgentRun,
    Artifacts,
    BuilderConfig,
    Capacity,
    Evaluation,
    EvaluatorConfig,
    HarnessConfig,
    ProxyEndpoints,
    Reconstruction,
    RuntimeConfig,
    SessionArtifacts,
    SessionEvent,
    SessionResult,
    SessionSpec,
    SessionState,
    Stage,
    StageSnapshot,
    TestResult,
)
from gateway.registration import HeartbeatReply, Lease
from polar_core.convert import (
    RUNTIME_KINDS,
    completion_from_proto,
    completion_to_proto,
    stats_to_proto,
    status_from_proto,
    strategy_from_proto,
    struct_to_dict,
    trace_from_proto,
    trace_to_proto,
)
from polar_core.convert import status_to_proto as _status_to_proto
from polar_core.durations import duration, seconds, timestamp, timestamp_seconds
from polar_core.errors import InvalidArgument
from polar_core.records import (
    AgentStatus,
    CompletionRecord,
    ReconstructionStats,
    ReconstructionStrategy,
    TerminalStatus,
)
from runtimes import RuntimeKind

__all__ = [
    "agent_status_to_proto",
    "capacity_to_proto",
    "completion_from_proto",
    "completion_to_proto",
    "endpoints_from_proto",
    "evaluate_request",
    "evaluation_from_proto",
    "event_to_proto",
    "heartbeat_reply_from_proto",
    "heartbeat_request",
    "lease_from_proto",
    "open_session_request",
    "prepare_request",
    "reconstruct_request",
    "reconstruction_from_proto",
    "result_to_proto",
    "snapshot_to_proto",
    "spec_from_proto",
    "stage_to_proto",
    "state_to_proto",
    "stats_from_proto",
    "status_from_proto",
    "status_to_proto",
    "strategy_to_proto",
    "struct_to_dict",
    "trace_from_proto",
    "trace_to_proto",
]

_IMAGE_KINDS = frozenset(kind.value for kind in RuntimeKind if kind.runs_image)
"""The runtime kinds whose image the evaluator is told about (it scores in the same image)."""
_STAGES = {
    Stage.INIT: status_pb2.SESSION_STAGE_INIT,
    Stage.READY: status_pb2.SESSION_STAGE_READY,
    Stage.RUNNING: status_pb2.SESSION_STAGE_RUNNING,
    Stage.POSTRUN: status_pb2.SESSION_STAGE_POSTRUN,
    Stage.DONE: status_pb2.SESSION_STAGE_DONE,
}
_STRATEGIES = {
    ReconstructionStrategy.PER_REQUEST: reconstruction_pb2.RECONSTRUCTION_STRATEGY_PER_REQUEST,
    ReconstructionStrategy.PREFIX_MERGE: reconstruction_pb2.RECONSTRUCTION_STRATEGY_PREFIX_MERGE,
    ReconstructionStrategy.EXACT: reconstruction_pb2.RECONSTRUCTION_STRATEGY_EXACT,
}
_AGENT_STATUS = {
    AgentStatus.COMPLETED: evaluator_service_pb2.AGENT_STATUS_COMPLETED,
    AgentStatus.TIMEOUT: evaluator_service_pb2.AGENT_STATUS_TIMEOUT,
    AgentStatus.ERROR: evaluator_service_pb2.AGENT_STATUS_ERROR,
    AgentStatus.CANCELLED: evaluator_service_pb2.AGENT_STATUS_CANCELLED,
}


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
        kind = RUNTIME_KINDS[task.runtime.kind] if task.runtime.kind != task_pb2.RUNTIME_KIND_UNSPECIFIED else ""
    except KeyError:
        raise InvalidArgument(f"unknown runtime kind {task.runtime.kind}") from None
    return SessionSpec(
        session_id=message.session_id,
        task_id=message.task_id or task.task_id,
        sample_index=message.sample_index,
        attempt=message.attempt or 1,
        instruction=task.instruction,
        agent_timeout_s=task.timeout_seconds,
        deadline=timestamp_seconds(message.deadline) if message.HasField("deadline") else None,
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
        stage_entered_at=timestamp(state.stage_entered_at),
        deadline=timestamp(state.deadline),
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
    message = session_pb2.SessionResult(
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
        harness_exit_code=result.harness_exit_code,
        dependency_unavailable=result.dependency_unavailable,
    )
    _put_artifacts(message, result.artifacts)
    return message


def _put_artifacts(message: session_pb2.SessionResult, kept: SessionArtifacts) -> None:
    """Set the fields of what the agent did (patch, tests, logs) on a ``SessionResult``."""
    message.patch = kept.patch
    message.patch_truncated = kept.patch_truncated
    for t in kept.test_outcomes:
        message.test_outcomes.add(test_id=t.test_id, outcome=t.outcome, duration=duration(t.duration_s))
    message.eval_log_ref = kept.eval_log_ref
    message.harness_stdout = kept.harness_stdout
    message.harness_stderr = kept.harness_stderr
    message.harness_log_truncated = kept.harness_log_truncated


def event_to_proto(event: SessionEvent) -> gateway_service_pb2.WatchSessionsResponse:
    """Return the ``WatchSessionsResponse`` of an event."""
    out = gateway_service_pb2.WatchSessionsResponse(state=state_to_proto(event.state), event_time=timestamp(event.time))
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


def capacity_to_proto(capacity: Capacity) -> gateway_service_pb2.GetCapacityResponse:
    """Return the ``GetCapacityResponse`` of a capacity."""
    return gateway_service_pb2.GetCapacityResponse(
        gateway_id=capacity.gateway_id,
        capacity=capacity.capacity,
        active_sessions=capacity.active,
        available=capacity.available,
        stage_metrics=[snapshot_to_proto(s) for s in capacity.stages],
        draining=capacity.draining,
    )


def strategy_to_proto(strategy: ReconstructionStrategy | None) -> reconstruction_pb2.ReconstructionStrategy:
    """Return the enum value of ``strategy`` (UNSPECIFIED, the reconstructor's default, for ``None``)."""
    if strategy is None:
        return reconstruction_pb2.RECONSTRUCTION_STRATEGY_UNSPECIFIED
    return _STRATEGIES[strategy]


def agent_status_to_proto(status: AgentStatus) -> evaluator_service_pb2.AgentStatus:
    """Return the evaluator's enum value of how the agent run ended."""
    return _AGENT_STATUS[status]


# ----------------------------------------------------------------------------------------- model proxy


def open_session_request(spec: SessionSpec, model: str) -> model_proxy_service_pb2.OpenSessionRequest:
    """Return the ``OpenSessionRequest`` of a session's attempt."""
    request = model_proxy_service_pb2.OpenSessionRequest(session_id=spec.proxy_session_id, model=model)
    request.metadata.update({"task_id": spec.task_id, "sample_index": spec.sample_index, "attempt": spec.attempt})
    return request


def endpoints_from_proto(reply: model_proxy_service_pb2.OpenSessionResponse) -> ProxyEndpoints:
    """Return the endpoints an ``OpenSessionResponse`` gives the harness."""
    return ProxyEndpoints(
        token=reply.session_token,
        anthropic_base_url=reply.anthropic_base_url,
        openai_base_url=reply.openai_base_url,
        google_base_url=reply.google_base_url,
    )


# ----------------------------------------------------------------------------------------- reconstructor


def reconstruct_request(
    completions: Sequence[CompletionRecord],
    *,
    task_id: str,
    reward: float,
    status: TerminalStatus,
    builder: BuilderConfig,
) -> reconstructor_service_pb2.ReconstructRequest:
    """Return the ``ReconstructRequest`` carrying ``completions`` inline."""
    return reconstructor_service_pb2.ReconstructRequest(
        completions=reconstructor_service_pb2.CompletionList(completions=[completion_to_proto(c) for c in completions]),
        strategy=strategy_to_proto(builder.strategy),
        end_of_turn_token_ids=builder.end_of_turn_ids,
        task_id=task_id,
        reward=reward,
        terminal_status=status_to_proto(status),
    )


def stats_from_proto(message: reconstruction_pb2.ReconstructionStats) -> ReconstructionStats:
    """Return the statistics of a ``ReconstructionStats`` message."""
    return ReconstructionStats(
        calls=message.calls,
        chains=message.chains,
        merges=message.merges,
        splits_by_reason=dict(message.splits_by_reason),
        mismatched_context_calls=message.mismatched_context_calls,
        mismatched_context_tokens=message.mismatched_context_tokens,
        trainable_tokens=message.trainable_tokens,
        total_tokens=message.total_tokens,
        aborted_calls=message.aborted_calls,
    )


def reconstruction_from_proto(reply: reconstructor_service_pb2.ReconstructResponse) -> Reconstruction:
    """Return the traces and statistics of a ``ReconstructResponse``."""
    return Reconstruction([trace_from_proto(t) for t in reply.traces], stats_from_proto(reply.stats))


# ----------------------------------------------------------------------------------------- evaluator


def prepare_request(spec: SessionSpec, request_id: str) -> evaluator_service_pb2.PrepareRequest:
    """Return the ``PrepareRequest`` of a session's evaluation environment."""
    evaluator = task_pb2.EvaluatorSpec(strategy=spec.evaluator.strategy)
    if spec.evaluator.options:
        evaluator.options.update(dict(spec.evaluator.options))
    request = evaluator_service_pb2.PrepareRequest(
        evaluator=evaluator,
        task_id=spec.task_id,
        session_id=spec.session_id,
        image=spec.runtime.image if spec.runtime.kind in _IMAGE_KINDS else "",
        request_id=request_id,
    )
    if spec.metadata:
        request.metadata.update(dict(spec.metadata))
    return request


def evaluate_request(
    handle: str, artifacts: Artifacts, run: AgentRun, *, timeout_s: float
) -> evaluator_service_pb2.EvaluateRequest:
    """Return the ``EvaluateRequest`` scoring ``artifacts`` within ``timeout_s``."""
    message = evaluator_service_pb2.EvaluationArtifacts(
        files=[evaluator_service_pb2.ArtifactFile(path=p, content=c) for p, c in artifacts.files.items()],
        agent_status=agent_status_to_proto(run.outcome),
        traces=[trace_to_proto(t) for t in artifacts.traces],
    )
    if artifacts.patch is not None:
        message.patch_bytes = artifacts.patch
    return evaluator_service_pb2.EvaluateRequest(handle=handle, artifacts=message, timeout=duration(timeout_s))


def evaluation_from_proto(reply: evaluator_service_pb2.EvaluateResponse) -> Evaluation:
    """Return the verdict of an ``EvaluateResponse``; an unknown terminal status counts as ``infra_error``."""
    try:
        status = status_from_proto(reply.terminal_status)
    except InvalidArgument:
        status = TerminalStatus.INFRA_ERROR
    return Evaluation(
        reply.reward,
        status,
        tuple(reply.trace_rewards),
        reply.error_message,
        test_outcomes=tuple(
            TestResult(t.test_id, _test_outcome_name(t.outcome), seconds(t.duration)) for t in reply.test_outcomes
        ),
        log_ref=reply.log_ref,
    )


def _test_outcome_name(value: int) -> str:
    """``TEST_OUTCOME_STATUS_PASSED`` -> ``passed`` (an unknown value -> ``unspecified``)."""
    try:
        name = evaluator_service_pb2.TestOutcomeStatus.Name(value)  # type: ignore[arg-type]
    except ValueError:
        return "unspecified"
    return str(name).removeprefix("TEST_OUTCOME_STATUS_").lower()


# ----------------------------------------------------------------------------------------- rollout server


def lease_from_proto(reply: rollout_service_pb2.RegisterGatewayResponse) -> Lease:
    """Return the lease a ``RegisterGatewayResponse`` grants."""
    return Lease(heartbeat_interval_s=seconds(reply.heartbeat_interval), lease_ttl_s=seconds(reply.lease_ttl))


def heartbeat_request(capacity: Capacity) -> rollout_service_pb2.HeartbeatRequest:
    """Return the ``HeartbeatRequest`` reporting ``capacity``."""
    return rollout_service_pb2.HeartbeatRequest(
        gateway_id=capacity.gateway_id,
        capacity=capacity.active + capacity.available,
        active_sessions=capacity.active,
        stage_metrics=[snapshot_to_proto(s) for s in capacity.stages],
        draining=capacity.draining,
    )


def heartbeat_reply_from_proto(reply: rollout_service_pb2.HeartbeatResponse) -> HeartbeatReply:
    """Return what a ``HeartbeatResponse`` asks of the gateway."""
    return HeartbeatReply(reply.drain_requested, tuple(reply.cancelled_session_ids))
