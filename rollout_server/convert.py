"""Protobuf <-> domain records, for the servicer and the gateway/callback adapters (no gRPC here)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from typing import Any, cast

from google.protobuf import duration_pb2, json_format
from polar.common.v1 import session_pb2, status_pb2, task_pb2
from polar.proxy.v1 import model_proxy_service_pb2
from polar.rollout.v1 import rollout_service_pb2

from polar_core.durations import seconds, timestamp
from polar_core.errors import InvalidArgument
from polar_core.limits import chunked
from polar_core.policy_version import parse_version
from polar_core.records import TerminalStatus
from rollout_server.models import (
    CallbackTarget,
    GatewayRecord,
    NewTask,
    PauseMode,
    PolicyRecord,
    ProxyRecord,
    ProxyUpdateState,
    ResultRecord,
    StalePolicy,
    TaskState,
    UpdateOutcome,
)
from rollout_server.ports import ProxyPolicyView
from rollout_server.staleness import policy_lag
from rollout_server.stats import Distribution, TaskSummary

__all__ = [
    "gateway_from_register",
    "new_task_from_proto",
    "outcome_to_proto",
    "pause_mode_from_proto",
    "policy_to_proto",
    "proxy_info_to_proto",
    "proxy_policy_from_proto",
    "result_from_proto",
    "result_to_json",
    "result_to_proto",
    "results_page_to_proto",
    "split_result",
    "summary_to_proto",
    "task_state_from_proto",
    "terminal_status_to_proto",
]

_DEFAULT_SESSION_TIMEOUT_S = 600.0

_TASK_STATES = {
    TaskState.PENDING: status_pb2.TASK_STATUS_PENDING,
    TaskState.RUNNING: status_pb2.TASK_STATUS_RUNNING,
    TaskState.COMPLETED: status_pb2.TASK_STATUS_COMPLETED,
    TaskState.CANCELLED: status_pb2.TASK_STATUS_CANCELLED,
    TaskState.FAILED: status_pb2.TASK_STATUS_FAILED,
}
_TASK_STATES_BACK = {v: k for k, v in _TASK_STATES.items()}
_STALE_POLICIES = {
    task_pb2.STALE_POLICY_UNSPECIFIED: None,
    task_pb2.STALE_POLICY_KEEP: StalePolicy.KEEP,
    task_pb2.STALE_POLICY_RESAMPLE: StalePolicy.RESAMPLE,
}


def terminal_status_to_proto(status: TerminalStatus) -> status_pb2.TerminalStatus:
    """Map a terminal status to its enum value."""
    return cast(status_pb2.TerminalStatus, status_pb2.TerminalStatus.Value(f"TERMINAL_STATUS_{status.name}"))


def task_state_from_proto(value: int) -> TaskState | None:
    """Map a TaskStatus enum value to a state; ``None`` for UNSPECIFIED (any)."""
    if value == status_pb2.TASK_STATUS_UNSPECIFIED:
        return None
    try:
        return _TASK_STATES_BACK[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgument(f"unknown task status {value}") from None


def new_task_from_proto(task: task_pb2.Task, task_timeout: duration_pb2.Duration | None = None) -> NewTask:
    """Validate a submitted task and turn it into a :class:`NewTask` (assigning an id when it has none).

    Raises:
        InvalidArgument: For a malformed task.
    """
    task = task_pb2.Task.FromString(task.SerializeToString())
    if not task.task_id:
        task.task_id = uuid.uuid4().hex
    if task.num_samples < 1:
        raise InvalidArgument("num_samples must be at least 1", details={"task_id": task.task_id})
    if task.timeout_seconds < 0:
        raise InvalidArgument("timeout_seconds must not be negative", details={"task_id": task.task_id})
    if not task.instruction:
        raise InvalidArgument("instruction is required", details={"task_id": task.task_id})
    callback = None
    which = task.callback.WhichOneof("target") if task.HasField("callback") else None
    if which == "http_url":
        if not task.callback.http_url.startswith(("http://", "https://")):
            raise InvalidArgument("callback.http_url must be an http(s) URL")
        callback = CallbackTarget("http", task.callback.http_url, task.callback.max_attempts)
    elif which == "grpc_target":
        callback = CallbackTarget("grpc", task.callback.grpc_target, task.callback.max_attempts)
    max_lag, stale_policy = _staleness_from_proto(task)
    timeout_s = seconds(task_timeout) if task_timeout is not None else 0.0
    if timeout_s < 0:
        raise InvalidArgument("task_timeout must not be negative")
    spec = task.SerializeToString(deterministic=True)
    digest = hashlib.sha256(spec + f"|timeout={timeout_s!r}".encode()).hexdigest()
    return NewTask(
        task_id=task.task_id,
        spec=spec,
        spec_hash=digest,
        num_samples=task.num_samples,
        priority=task.priority,
        early_stop_min_usable=task.early_stop_min_usable_sessions,
        session_timeout_s=task.timeout_seconds or _DEFAULT_SESSION_TIMEOUT_S,
        callback=callback,
        task_timeout_s=timeout_s or None,
        max_policy_lag=max_lag,
        stale_policy=stale_policy,
    )


def _staleness_from_proto(task: task_pb2.Task) -> tuple[int | None, StalePolicy | None]:
    """The task's ``max_policy_lag`` (``None``: unset) and stale policy (``None``: unspecified), validated."""
    max_lag = task.max_policy_lag if task.HasField("max_policy_lag") else None
    if max_lag is not None and max_lag < 0:
        raise InvalidArgument("max_policy_lag must not be negative", details={"task_id": task.task_id})
    if task.stale_policy not in _STALE_POLICIES:
        raise InvalidArgument(f"unknown stale_policy {task.stale_policy}", details={"task_id": task.task_id})
    return max_lag, _STALE_POLICIES[task.stale_policy]


def result_from_proto(pb: session_pb2.SessionResult) -> ResultRecord:
    """Turn a reported SessionResult into a record; the status name and enum must agree.

    Raises:
        InvalidArgument: Missing session id or status, or an unknown or inconsistent status.
    """
    if not pb.session_id:
        raise InvalidArgument("result.session_id is required")
    status: TerminalStatus | None = None
    if pb.status:
        try:
            status = TerminalStatus(pb.status)
        except ValueError:
            raise InvalidArgument(f"unknown status {pb.status!r}", details={"session_id": pb.session_id}) from None
    if pb.terminal_status != status_pb2.TERMINAL_STATUS_UNSPECIFIED:
        name = status_pb2.TerminalStatus.Name(pb.terminal_status).removeprefix("TERMINAL_STATUS_").lower()
        from_enum = TerminalStatus(name)
        if status is not None and status is not from_enum:
            raise InvalidArgument("status and terminal_status disagree", details={"session_id": pb.session_id})
        status = from_enum
    if status is None:
        raise InvalidArgument("result.status is required", details={"session_id": pb.session_id})
    versions: list[str] = []
    for trace in pb.traces:
        for v in trace.policy_versions:
            if v not in versions:
                versions.append(v)
    stats = pb.statistics
    return ResultRecord(
        session_id=pb.session_id,
        task_id=pb.task_id,
        sample_index=pb.sample_index,
        status=status,
        reward=pb.reward,
        attempt=pb.attempt,
        gateway_id=pb.gateway_id,
        idempotency_key=pb.idempotency_key,
        error_message=pb.error_message,
        duration_s=float(pb.timings.get("total", 0.0)),
        calls=int(stats.completions or stats.reconstruction.calls),
        chains=int(len(pb.traces) or stats.reconstruction.chains),
        policy_versions=versions,
        payload=pb.SerializeToString(),
        harness_exit_code=pb.harness_exit_code if pb.HasField("harness_exit_code") else None,
        dependency_unavailable=pb.dependency_unavailable,
    )


def result_to_proto(record: ResultRecord, *, omit_traces: bool = False) -> session_pb2.SessionResult:
    """Turn a stored result back into a SessionResult; the server's bookkeeping fields win over the payload.

    With ``omit_traces`` the result's traces are left out.
    """
    pb = session_pb2.SessionResult.FromString(record.payload) if record.payload else session_pb2.SessionResult()
    if omit_traces:
        del pb.traces[:]
    pb.session_id = record.session_id
    pb.task_id = record.task_id
    pb.sample_index = record.sample_index
    pb.status = record.status.value
    pb.terminal_status = terminal_status_to_proto(record.status)
    pb.reward = record.reward
    pb.attempt = record.attempt
    pb.gateway_id = record.gateway_id
    pb.idempotency_key = record.idempotency_key
    if record.error_message:
        pb.error_message = record.error_message
    pb.policy_lag = record.policy_lag
    for trace in pb.traces:
        trace.policy_lag = policy_lag(record.fleet_version, trace.policy_versions)
    if record.harness_exit_code is not None:
        pb.harness_exit_code = record.harness_exit_code
    pb.dependency_unavailable = record.dependency_unavailable
    return pb


def results_page_to_proto(
    records: Sequence[ResultRecord],
    *,
    omit_traces: bool,
    max_results: int,
    max_bytes: int,
    from_trace: int = 0,
    max_result_bytes: int = 0,
) -> tuple[list[session_pb2.SessionResult], int, int]:
    """A page of ``records`` as SessionResults, and where the next page starts (0, 0 after the last).

    At most ``max_results`` (0: any number) results whose serialized sizes stay within ``max_bytes`` (0: no
    budget), and always one when there is one; ``omit_traces`` leaves every result's traces out. The first
    result starts at trace ``from_trace``. With ``max_result_bytes``, a result larger than it (or than
    ``max_bytes``) starts a page of its own and is cut after the traces that fit, and the returned trace index
    says where its next part starts.

    Returns:
        The page, the ``result_index`` of the next page's first result and the index of its first trace.
    """
    chosen = records[:max_results] if max_results > 0 else records
    limit = min(b for b in (max_bytes, max_result_bytes) if b > 0) if max_result_bytes > 0 else 0
    page: list[session_pb2.SessionResult] = []
    total = 0
    for position, record in enumerate(chosen):
        message = result_to_proto(record, omit_traces=omit_traces)
        first = from_trace if position == 0 else 0
        if first:
            del message.traces[:first]
        size = message.ByteSize()
        if page and ((max_bytes > 0 and total + size > max_bytes) or (limit and size > limit)):
            return page, record.result_index, 0
        if limit and size > limit:
            part, _ = split_result(message, limit)[0]
            page.append(part)
            if len(part.traces) < len(message.traces):
                return page, record.result_index, first + len(part.traces)
            size = part.ByteSize()
        else:
            page.append(message)
        total += size
    if len(chosen) < len(records):
        return page, records[len(chosen)].result_index, 0
    return page, 0, 0


def split_result(message: session_pb2.SessionResult, max_bytes: int) -> list[tuple[session_pb2.SessionResult, int]]:
    """Split a result larger than ``max_bytes`` into parts that share its other fields and split its traces.

    Each part holds the next traces that fit (at least one). Returns each part with the index of its first
    trace; a result within the budget (or ``max_bytes`` 0, or one trace at most) is one part.
    """
    if max_bytes <= 0 or len(message.traces) <= 1 or message.ByteSize() <= max_bytes:
        return [(message, 0)]
    base = session_pb2.SessionResult()
    base.CopyFrom(message)
    del base.traces[:]
    budget = max(1, max_bytes - base.ByteSize())
    parts: list[tuple[session_pb2.SessionResult, int]] = []
    first = 0
    for chunk in chunked(message.traces, budget):
        part = session_pb2.SessionResult()
        part.CopyFrom(base)
        part.traces.extend(chunk)
        parts.append((part, first))
        first += len(chunk)
    return parts


def result_to_json(record: ResultRecord) -> dict[str, Any]:
    """The JSON form of a result (proto field names), as POSTed to HTTP callbacks."""
    return json_format.MessageToDict(result_to_proto(record), preserving_proto_field_name=True)


def _distribution(d: Distribution) -> rollout_service_pb2.Distribution:
    return rollout_service_pb2.Distribution(count=d.count, mean=d.mean, p50=d.p50, p90=d.p90, max=d.max)


def summary_to_proto(summary: TaskSummary) -> rollout_service_pb2.TaskInfo:
    """Turn a task summary into TaskInfo."""
    task = summary.task
    st = summary.statistics
    info = rollout_service_pb2.TaskInfo(
        task=task_pb2.Task.FromString(task.spec),
        status=_TASK_STATES[task.state],
        sessions_total=summary.sessions_total,
        sessions_done=summary.sessions_done,
        sessions_usable=summary.sessions_usable,
        sessions_running=summary.sessions_running,
        sessions_by_status=summary.sessions_by_status,
        mean_reward=summary.mean_reward,
        submitted_at=timestamp(task.submitted_at),
        error_message=task.error_message,
        deadline=timestamp(task.deadline),
        statistics=rollout_service_pb2.TaskStatistics(
            session_duration_seconds=_distribution(st.session_duration_s),
            calls=_distribution(st.calls),
            chains=_distribution(st.chains),
            policy_age=_distribution(st.policy_age),
            reward_by_policy_age=[
                rollout_service_pb2.PolicyAgeBucket(
                    policy_age=b.policy_age, sessions=b.sessions, mean_reward=b.mean_reward
                )
                for b in st.reward_by_policy_age
            ],
            sessions_dropped=st.sessions_dropped,
            sessions_retried=st.sessions_retried,
            sessions_truncated=st.sessions_truncated,
            attempts_total=st.attempts_total,
            deliveries_pending=st.deliveries_pending,
            deliveries_dead_lettered=st.deliveries_dead_lettered,
            deliveries_delivered=st.deliveries_delivered,
            policy_lag=_distribution(st.policy_lag),
            sessions_stale_resampled=st.sessions_stale_resampled,
            sessions_stale_kept=st.sessions_stale_kept,
        ),
    )
    if task.finished_at is not None:
        info.finished_at.CopyFrom(timestamp(task.finished_at))
    return info


def gateway_from_register(request: rollout_service_pb2.RegisterGatewayRequest) -> GatewayRecord:
    """Turn a RegisterGateway request into a gateway record."""
    return GatewayRecord(
        gateway_id=request.gateway_id,
        address=request.address,
        capacity=request.capacity,
        labels=dict(request.labels),
        version=request.version,
    )


def stage_metrics_from_proto(metrics: Any) -> dict[str, dict[str, int]]:
    """Turn repeated StageMetrics into ``{stage: {queue_length, occupancy, workers}}``."""
    out: dict[str, dict[str, int]] = {}
    for m in metrics:
        name = status_pb2.SessionStage.Name(m.stage).removeprefix("SESSION_STAGE_").lower()
        out[name] = {"queue_length": m.queue_length, "occupancy": m.occupancy, "workers": m.workers}
    return out


# Policy ----------------------------------------------------------------------------------------------------------

_PROXY_STATES = {
    ProxyUpdateState.UPDATED: rollout_service_pb2.PROXY_UPDATE_STATE_UPDATED,
    ProxyUpdateState.FAILED: rollout_service_pb2.PROXY_UPDATE_STATE_FAILED,
}


def pause_mode_from_proto(value: int) -> PauseMode:
    """Map a PauseMode enum value (UNSPECIFIED: drain) to the domain's mode.

    Raises:
        InvalidArgument: An unknown value.
    """
    if value in (rollout_service_pb2.PAUSE_MODE_UNSPECIFIED, rollout_service_pb2.PAUSE_MODE_DRAIN):
        return PauseMode.DRAIN
    if value == rollout_service_pb2.PAUSE_MODE_ABORT:
        return PauseMode.ABORT
    raise InvalidArgument(f"unknown pause_mode {value}")


def policy_to_proto(policy: PolicyRecord) -> rollout_service_pb2.PolicyInfo:
    """A PolicyInfo (no ``updated_at`` before the first update)."""
    info = rollout_service_pb2.PolicyInfo(version=policy.version, weights_path=policy.weights_path)
    if policy.updated_at:
        info.updated_at.CopyFrom(timestamp(policy.updated_at))
    return info


def outcome_to_proto(outcome: UpdateOutcome) -> rollout_service_pb2.UpdatePolicyResponse:
    """An UpdatePolicyResponse."""
    return rollout_service_pb2.UpdatePolicyResponse(
        policy=policy_to_proto(outcome.policy),
        proxies=[
            rollout_service_pb2.ProxyUpdate(
                proxy_id=p.proxy_id,
                address=p.address,
                state=_PROXY_STATES[p.state],
                error=p.error,
                load_seconds=p.load_seconds,
                aborted_calls=p.aborted_calls,
            )
            for p in outcome.proxies
        ],
        complete=outcome.complete,
        replayed=outcome.replayed,
        seconds=outcome.seconds,
    )


def gateway_info_to_proto(gateway: GatewayRecord, now: float) -> rollout_service_pb2.GatewayInfo:
    """A GatewayInfo (``live`` when its lease has not run out at ``now``)."""
    return rollout_service_pb2.GatewayInfo(
        gateway_id=gateway.gateway_id,
        address=gateway.address,
        capacity=gateway.capacity,
        active_sessions=gateway.active_sessions,
        draining=gateway.draining,
        live=gateway.lease_expires_at > now,
        lease_expires_at=timestamp(gateway.lease_expires_at),
        version=gateway.version,
        labels=gateway.labels,
    )


def proxy_info_to_proto(proxy: ProxyRecord) -> rollout_service_pb2.ProxyInfo:
    """A ProxyInfo."""
    return rollout_service_pb2.ProxyInfo(
        proxy_id=proxy.proxy_id,
        address=proxy.address,
        version=proxy.version,
        paused=proxy.paused,
        error=proxy.error,
        registered_at=timestamp(proxy.registered_at),
    )


def proxy_policy_from_proto(reply: model_proxy_service_pb2.GetPolicyResponse) -> ProxyPolicyView:
    """A proxy's GetPolicy answer as the coordinator reads it."""
    return ProxyPolicyView(parse_version(reply.policy_version), reply.weights_path, reply.paused, reply.in_flight)
