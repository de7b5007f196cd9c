"""Row mappers of the SQL store: each record to the tuple of its table's columns and back.

The ``*_COLS`` strings name the columns in the order the tuples hold them; :mod:`rollout_server.store.sql`
builds its statements from them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from polar_core.records import TerminalStatus
from rollout_server.models import (
    CallbackTarget,
    DeliveryRecord,
    DeliveryState,
    GatewayRecord,
    PolicyRecord,
    ProxyRecord,
    ResultRecord,
    SessionRecord,
    SessionState,
    StalePolicy,
    TaskRecord,
    TaskState,
)

__all__ = [
    "DELIVERY_COLS",
    "GATEWAY_COLS",
    "POLICY_COLS",
    "PROXY_COLS",
    "REPORT_COLS",
    "RESULT_COLS",
    "SESSION_COLS",
    "TASK_COLS",
    "TASK_SELECT",
    "Row",
    "delivery_from",
    "delivery_row",
    "gateway_from",
    "gateway_row",
    "opt_float",
    "policy_from",
    "policy_row",
    "proxy_from",
    "proxy_row",
    "report_row",
    "result_from",
    "result_row",
    "session_from",
    "session_row",
    "task_from",
    "task_row",
]

Row = Sequence[Any]

TASK_COLS = (
    "task_id, spec, spec_hash, num_samples, priority, early_stop, session_timeout_s, callback_kind, "
    "callback_target, callback_max_attempts, state, submitted_at, deadline, finished_at, error_message, "
    "trace_context, max_policy_lag, stale_policy"
)
TASK_SELECT = f"SELECT {TASK_COLS}, seq, results_count FROM tasks"
SESSION_COLS = (
    "session_id, task_id, sample_index, state, attempt, infra_failures, gateway_id, not_before, dispatched_at, "
    "deadline, priority, task_seq, stale_resamples"
)
RESULT_COLS = (
    "session_id, task_id, sample_index, status, reward, attempt, gateway_id, idempotency_key, error_message, "
    "duration_s, calls, chains, policy_versions, {payload}, result_index, recorded_at, policy_lag, fleet_version"
)
GATEWAY_COLS = (
    "gateway_id, address, capacity, draining, lease_expires_at, active_sessions, labels, version, stage_metrics"
)
POLICY_COLS = "version, weights_path, updated_at"
PROXY_COLS = "proxy_id, address, backend, version, paused, error, registered_at"
REPORT_COLS = "idempotency_key, session_id, attempt, status, gateway_id, error_message, final, recorded_at"
DELIVERY_COLS = (
    "idempotency_key, task_id, session_id, target_kind, target, max_attempts, state, attempts, next_attempt_at, "
    "last_error"
)


def opt_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def task_row(t: TaskRecord) -> tuple[Any, ...]:
    cb = t.callback
    return (
        t.task_id,
        t.spec,
        t.spec_hash,
        t.num_samples,
        t.priority,
        t.early_stop_min_usable,
        float(t.session_timeout_s),
        cb.kind if cb else "",
        cb.target if cb else "",
        cb.max_attempts if cb else 0,
        t.state.value,
        float(t.submitted_at),
        float(t.deadline),
        opt_float(t.finished_at),
        t.error_message,
        json.dumps(t.trace_context, sort_keys=True) if t.trace_context else "",
        t.max_policy_lag,
        t.stale_policy.value,
    )


def task_from(r: Row) -> TaskRecord:
    callback = CallbackTarget(r[7], r[8], int(r[9])) if r[7] else None
    return TaskRecord(
        task_id=r[0],
        spec=bytes(r[1]),
        spec_hash=r[2],
        num_samples=int(r[3]),
        priority=int(r[4]),
        early_stop_min_usable=int(r[5]),
        session_timeout_s=float(r[6]),
        callback=callback,
        state=TaskState(r[10]),
        submitted_at=float(r[11]),
        deadline=float(r[12]),
        finished_at=None if r[13] is None else float(r[13]),
        error_message=r[14],
        trace_context=json.loads(r[15]) if r[15] else {},
        max_policy_lag=None if r[16] is None else int(r[16]),
        stale_policy=StalePolicy(r[17]),
        seq=int(r[18]),
        results_count=int(r[19]),
    )


def session_row(s: SessionRecord) -> tuple[Any, ...]:
    return (
        s.session_id,
        s.task_id,
        s.sample_index,
        s.state.value,
        s.attempt,
        s.infra_failures,
        s.gateway_id,
        float(s.not_before),
        opt_float(s.dispatched_at),
        opt_float(s.deadline),
        s.priority,
        s.task_seq,
        s.stale_resamples,
    )


def session_from(r: Row) -> SessionRecord:
    return SessionRecord(
        session_id=r[0],
        task_id=r[1],
        sample_index=int(r[2]),
        state=SessionState(r[3]),
        attempt=int(r[4]),
        infra_failures=int(r[5]),
        gateway_id=r[6],
        not_before=float(r[7]),
        dispatched_at=None if r[8] is None else float(r[8]),
        deadline=None if r[9] is None else float(r[9]),
        priority=int(r[10]),
        task_seq=int(r[11]),
        stale_resamples=int(r[12]),
    )


def result_from(r: Row) -> ResultRecord:
    return ResultRecord(
        session_id=r[0],
        task_id=r[1],
        sample_index=int(r[2]),
        status=TerminalStatus(r[3]),
        reward=float(r[4]),
        attempt=int(r[5]),
        gateway_id=r[6],
        idempotency_key=r[7],
        error_message=r[8],
        duration_s=float(r[9]),
        calls=int(r[10]),
        chains=int(r[11]),
        policy_versions=list(json.loads(r[12])),
        payload=bytes(r[13]) if r[13] is not None else b"",
        result_index=int(r[14]),
        recorded_at=float(r[15]),
        policy_lag=int(r[16]),
        fleet_version=int(r[17]),
    )


def gateway_row(g: GatewayRecord) -> tuple[Any, ...]:
    return (
        g.gateway_id,
        g.address,
        g.capacity,
        int(g.draining),
        float(g.lease_expires_at),
        g.active_sessions,
        json.dumps(g.labels, sort_keys=True),
        g.version,
        json.dumps(g.stage_metrics, sort_keys=True),
    )


def gateway_from(r: Row) -> GatewayRecord:
    return GatewayRecord(
        gateway_id=r[0],
        address=r[1],
        capacity=int(r[2]),
        draining=bool(r[3]),
        lease_expires_at=float(r[4]),
        active_sessions=int(r[5]),
        labels=dict(json.loads(r[6])),
        version=r[7],
        stage_metrics=dict(json.loads(r[8])),
    )


def delivery_from(r: Row) -> DeliveryRecord:
    return DeliveryRecord(
        idempotency_key=r[0],
        task_id=r[1],
        session_id=r[2],
        target=CallbackTarget(r[3], r[4], int(r[5])),
        state=DeliveryState(r[6]),
        attempts=int(r[7]),
        next_attempt_at=float(r[8]),
        last_error=r[9],
    )


def result_row(r: ResultRecord) -> tuple[Any, ...]:
    """The ``results`` row of a result, in :data:`RESULT_COLS` order (with the payload)."""
    return (
        r.session_id,
        r.task_id,
        r.sample_index,
        r.status.value,
        float(r.reward),
        r.attempt,
        r.gateway_id,
        r.idempotency_key,
        r.error_message,
        float(r.duration_s),
        r.calls,
        r.chains,
        json.dumps(r.policy_versions),
        r.payload,
        r.result_index,
        float(r.recorded_at),
        r.policy_lag,
        r.fleet_version,
    )


def report_row(r: ResultRecord, *, final: bool) -> tuple[Any, ...]:
    """The ``reports`` row of a reported attempt, in :data:`REPORT_COLS` order."""
    return (
        r.idempotency_key,
        r.session_id,
        r.attempt,
        r.status.value,
        r.gateway_id,
        r.error_message,
        int(final),
        float(r.recorded_at),
    )


def delivery_row(d: DeliveryRecord) -> tuple[Any, ...]:
    """The ``deliveries`` row of a delivery, in :data:`DELIVERY_COLS` order."""
    return (
        d.idempotency_key,
        d.task_id,
        d.session_id,
        d.target.kind,
        d.target.target,
        d.target.max_attempts,
        d.state.value,
        d.attempts,
        float(d.next_attempt_at),
        d.last_error,
    )


def policy_row(p: PolicyRecord) -> tuple[Any, ...]:
    return (p.version, p.weights_path, float(p.updated_at))


def policy_from(r: Row) -> PolicyRecord:
    return PolicyRecord(version=int(r[0]), weights_path=r[1], updated_at=float(r[2]))


def proxy_row(p: ProxyRecord) -> tuple[Any, ...]:
    return (p.proxy_id, p.address, p.backend, p.version, int(p.paused), p.error, float(p.registered_at))


def proxy_from(r: Row) -> ProxyRecord:
    return ProxyRecord(
        proxy_id=r[0],
        address=r[1],
        backend=r[2],
        version=int(r[3]),
        paused=bool(r[4]),
        error=r[5],
        registered_at=float(r[6]),
    )
