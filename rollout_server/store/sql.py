"""One SQL implementation of :class:`~rollout_server.store.base.Store` over a tiny driver seam.

SQLite and PostgreSQL differ here only in a few column types, the autoincrement column, and placeholders
(``?`` vs ``$1``); each backend module supplies a :class:`SqlBackend` and the dialect's type names.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from polar_core.records import TerminalStatus
from rollout_server.models import (
    CallbackTarget,
    DeliveryRecord,
    DeliveryState,
    GatewayRecord,
    PolicyRecord,
    PolicyUpdateRecord,
    ProxyRecord,
    ResultRecord,
    SessionRecord,
    SessionState,
    TaskRecord,
    TaskState,
    UpdateOutcome,
    check_session_transition,
    check_task_transition,
)
from rollout_server.store.base import SessionChange

__all__ = ["SqlBackend", "SqlConnection", "SqlStore", "schema"]

Row = Sequence[Any]


class SqlConnection(Protocol):
    """A connection (inside a transaction or not) that takes ``?`` placeholders."""

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Run a statement; return the number of rows it changed."""

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run a statement once per row."""

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        """Run a query; return its rows."""


class SqlBackend(Protocol):
    """A database driver: connections, transactions and the dialect's type names."""

    types: dict[str, str]

    def transaction(self) -> AbstractAsyncContextManager[SqlConnection]:
        """A connection inside a transaction that commits on exit and rolls back on error."""

    def connection(self) -> AbstractAsyncContextManager[SqlConnection]:
        """A connection for reads."""

    async def close(self) -> None:
        """Close every connection."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
  seq {serial},
  task_id TEXT NOT NULL UNIQUE,
  spec {blob} NOT NULL,
  spec_hash TEXT NOT NULL,
  num_samples {int} NOT NULL,
  priority {int} NOT NULL,
  early_stop {int} NOT NULL,
  session_timeout_s {real} NOT NULL,
  callback_kind TEXT NOT NULL,
  callback_target TEXT NOT NULL,
  callback_max_attempts {int} NOT NULL,
  state TEXT NOT NULL,
  submitted_at {real} NOT NULL,
  deadline {real} NOT NULL,
  finished_at {real},
  error_message TEXT NOT NULL,
  results_count {int} NOT NULL DEFAULT 0,
  trace_context TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS tasks_state ON tasks (state, seq);
CREATE TABLE IF NOT EXISTS sessions (
  session_id TEXT PRIMARY KEY,
  task_id TEXT NOT NULL,
  sample_index {int} NOT NULL,
  state TEXT NOT NULL,
  attempt {int} NOT NULL,
  infra_failures {int} NOT NULL,
  gateway_id TEXT NOT NULL,
  not_before {real} NOT NULL,
  dispatched_at {real},
  deadline {real},
  priority {int} NOT NULL,
  task_seq {int} NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_task ON sessions (task_id, sample_index);
CREATE INDEX IF NOT EXISTS sessions_queue ON sessions (state, priority, task_seq, sample_index);
CREATE TABLE IF NOT EXISTS results (
  session_id TEXT PRIMARY KEY,
  task_id TEXT NOT NULL,
  sample_index {int} NOT NULL,
  result_index {int} NOT NULL,
  status TEXT NOT NULL,
  reward {real} NOT NULL,
  attempt {int} NOT NULL,
  gateway_id TEXT NOT NULL,
  idempotency_key TEXT NOT NULL UNIQUE,
  error_message TEXT NOT NULL,
  duration_s {real} NOT NULL,
  calls {int} NOT NULL,
  chains {int} NOT NULL,
  policy_versions TEXT NOT NULL,
  payload {blob} NOT NULL,
  recorded_at {real} NOT NULL,
  UNIQUE (task_id, result_index)
);
CREATE TABLE IF NOT EXISTS reports (
  idempotency_key TEXT PRIMARY KEY,
  session_id TEXT NOT NULL,
  attempt {int} NOT NULL,
  status TEXT NOT NULL,
  gateway_id TEXT NOT NULL,
  error_message TEXT NOT NULL,
  final {int} NOT NULL,
  recorded_at {real} NOT NULL
);
CREATE TABLE IF NOT EXISTS policy_versions (
  version TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS gateways (
  gateway_id TEXT PRIMARY KEY,
  address TEXT NOT NULL,
  capacity {int} NOT NULL,
  draining {int} NOT NULL,
  lease_expires_at {real} NOT NULL,
  active_sessions {int} NOT NULL,
  labels TEXT NOT NULL,
  version TEXT NOT NULL,
  stage_metrics TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS deliveries (
  idempotency_key TEXT PRIMARY KEY,
  task_id TEXT NOT NULL,
  session_id TEXT NOT NULL,
  target_kind TEXT NOT NULL,
  target TEXT NOT NULL,
  max_attempts {int} NOT NULL,
  state TEXT NOT NULL,
  attempts {int} NOT NULL,
  next_attempt_at {real} NOT NULL,
  last_error TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (state, next_attempt_at);
CREATE INDEX IF NOT EXISTS deliveries_task ON deliveries (task_id);
CREATE TABLE IF NOT EXISTS policies (
  version {int} PRIMARY KEY,
  weights_path TEXT NOT NULL,
  updated_at {real} NOT NULL,
  outcome TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS proxies (
  proxy_id TEXT PRIMARY KEY,
  address TEXT NOT NULL,
  backend TEXT NOT NULL,
  version {int} NOT NULL,
  paused {int} NOT NULL,
  error TEXT NOT NULL,
  registered_at {real} NOT NULL
);
"""


def schema(types: dict[str, str]) -> list[str]:
    """Return the schema's statements with the dialect's type names filled in."""
    return [s.strip() for s in _SCHEMA.format(**types).split(";") if s.strip()]


# Columns added after a table's first release: (table, column, definition). A database made before the
# column existed gets it by ``ALTER TABLE ... ADD COLUMN`` on start; rows already there take the default.
ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (("tasks", "trace_context", "TEXT NOT NULL DEFAULT ''"),)


_TASK_COLS = (
    "task_id, spec, spec_hash, num_samples, priority, early_stop, session_timeout_s, callback_kind, "
    "callback_target, callback_max_attempts, state, submitted_at, deadline, finished_at, error_message, "
    "trace_context"
)
_TASK_SELECT = f"SELECT {_TASK_COLS}, seq, results_count FROM tasks"
_SESSION_COLS = (
    "session_id, task_id, sample_index, state, attempt, infra_failures, gateway_id, not_before, dispatched_at, "
    "deadline, priority, task_seq"
)
_RESULT_COLS = (
    "session_id, task_id, sample_index, status, reward, attempt, gateway_id, idempotency_key, error_message, "
    "duration_s, calls, chains, policy_versions, {payload}, result_index, recorded_at"
)
_GATEWAY_COLS = (
    "gateway_id, address, capacity, draining, lease_expires_at, active_sessions, labels, version, stage_metrics"
)
_PROXY_COLS = "proxy_id, address, backend, version, paused, error, registered_at"
_DELIVERY_COLS = (
    "idempotency_key, task_id, session_id, target_kind, target, max_attempts, state, attempts, next_attempt_at, "
    "last_error"
)


def _opt_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _task_row(t: TaskRecord) -> tuple[Any, ...]:
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
        _opt_float(t.finished_at),
        t.error_message,
        json.dumps(t.trace_context, sort_keys=True) if t.trace_context else "",
    )


def _task_from(r: Row) -> TaskRecord:
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
        seq=int(r[16]),
        results_count=int(r[17]),
    )


def _session_row(s: SessionRecord) -> tuple[Any, ...]:
    return (
        s.session_id,
        s.task_id,
        s.sample_index,
        s.state.value,
        s.attempt,
        s.infra_failures,
        s.gateway_id,
        float(s.not_before),
        _opt_float(s.dispatched_at),
        _opt_float(s.deadline),
        s.priority,
        s.task_seq,
    )


def _session_from(r: Row) -> SessionRecord:
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
    )


def _result_from(r: Row) -> ResultRecord:
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
    )


def _gateway_row(g: GatewayRecord) -> tuple[Any, ...]:
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


def _gateway_from(r: Row) -> GatewayRecord:
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


def _proxy_from(r: Row) -> ProxyRecord:
    return ProxyRecord(
        proxy_id=r[0],
        address=r[1],
        backend=r[2],
        version=int(r[3]),
        paused=bool(r[4]),
        error=r[5],
        registered_at=float(r[6]),
    )


def _delivery_from(r: Row) -> DeliveryRecord:
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


_SESSION_CAS = (
    "UPDATE sessions SET state = ?, attempt = ?, infra_failures = ?, gateway_id = ?, not_before = ?, "
    "dispatched_at = ?, deadline = ? WHERE session_id = ? AND state = ? AND attempt = ?"
)


def _cas_args(change: SessionChange) -> tuple[Any, ...]:
    new, expected_state, expected_attempt = change
    check_session_transition(expected_state, new.state)
    return (
        new.state.value,
        new.attempt,
        new.infra_failures,
        new.gateway_id,
        float(new.not_before),
        _opt_float(new.dispatched_at),
        _opt_float(new.deadline),
        new.session_id,
        expected_state.value,
        expected_attempt,
    )


class SqlStore:
    """A :class:`~rollout_server.store.base.Store` over any :class:`SqlBackend`."""

    def __init__(self, backend: SqlBackend) -> None:
        self._db = backend

    async def init(self) -> None:
        """Create the schema if it does not exist, and add columns that an older database lacks."""
        async with self._db.transaction() as conn:
            for statement in schema(self._db.types):
                await conn.execute(statement)
        for table, column, definition in ADDED_COLUMNS:
            try:
                async with self._db.connection() as conn:
                    await conn.fetch(f"SELECT {column} FROM {table} WHERE 1 = 0")
            except Exception:
                async with self._db.transaction() as conn:
                    await conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")

    async def close(self) -> None:
        """Close the backend."""
        await self._db.close()

    # Tasks -----------------------------------------------------------------------------------------------
    async def insert_task(self, task: TaskRecord, sessions: Sequence[SessionRecord]) -> tuple[TaskRecord, bool]:
        """Insert a task and its sessions unless the id exists."""
        async with self._db.transaction() as conn:
            rows = await conn.fetch(
                f"INSERT INTO tasks ({_TASK_COLS}) VALUES ({', '.join('?' * 16)}) "
                "ON CONFLICT (task_id) DO NOTHING RETURNING seq",
                _task_row(task),
            )
            if not rows:
                existing = await conn.fetch(f"{_TASK_SELECT} WHERE task_id = ?", (task.task_id,))
                return _task_from(existing[0]), False
            seq = int(rows[0][0])
            for s in sessions:
                s.task_seq = seq
            await conn.executemany(
                f"INSERT INTO sessions ({_SESSION_COLS}) VALUES ({', '.join('?' * 12)})",
                [_session_row(s) for s in sessions],
            )
        task.seq = seq
        return task, True

    async def get_task(self, task_id: str) -> TaskRecord | None:
        """Return a task, or ``None``."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(f"{_TASK_SELECT} WHERE task_id = ?", (task_id,))
        return _task_from(rows[0]) if rows else None

    async def list_tasks(self, limit: int, before_seq: int | None, state: TaskState | None) -> list[TaskRecord]:
        """Return tasks newest first."""
        where: list[str] = []
        args: list[Any] = []
        if before_seq is not None:
            where.append("seq < ?")
            args.append(before_seq)
        if state is not None:
            where.append("state = ?")
            args.append(state.value)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        async with self._db.connection() as conn:
            rows = await conn.fetch(f"{_TASK_SELECT}{clause} ORDER BY seq DESC LIMIT ?", (*args, limit))
        return [_task_from(r) for r in rows]

    async def active_tasks(self) -> list[TaskRecord]:
        """Return pending and running tasks, oldest first."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(f"{_TASK_SELECT} WHERE state IN ('pending', 'running') ORDER BY seq")
        return [_task_from(r) for r in rows]

    async def set_task_state(
        self, task_id: str, expected: TaskState, new: TaskState, *, finished_at: float | None, error_message: str
    ) -> bool:
        """Compare-and-set a task's state."""
        check_task_transition(expected, new)
        async with self._db.transaction() as conn:
            changed = await conn.execute(
                "UPDATE tasks SET state = ?, finished_at = ?, error_message = ? WHERE task_id = ? AND state = ?",
                (new.value, _opt_float(finished_at), error_message, task_id, expected.value),
            )
        return changed == 1

    # Sessions --------------------------------------------------------------------------------------------
    async def get_session(self, session_id: str) -> SessionRecord | None:
        """Return a session, or ``None``."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(f"SELECT {_SESSION_COLS} FROM sessions WHERE session_id = ?", (session_id,))
        return _session_from(rows[0]) if rows else None

    async def task_sessions(self, task_id: str) -> list[SessionRecord]:
        """Return a task's sessions by sample index."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                f"SELECT {_SESSION_COLS} FROM sessions WHERE task_id = ? ORDER BY sample_index", (task_id,)
            )
        return [_session_from(r) for r in rows]

    async def dispatchable_sessions(self, now: float, limit: int) -> list[SessionRecord]:
        """Return due pending sessions in dispatch order."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                f"SELECT {_SESSION_COLS} FROM sessions WHERE state = 'pending' AND not_before <= ? "
                "ORDER BY priority DESC, task_seq, sample_index LIMIT ?",
                (float(now), limit),
            )
        return [_session_from(r) for r in rows]

    async def in_flight_sessions(self) -> list[SessionRecord]:
        """Return starting and running sessions."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                f"SELECT {_SESSION_COLS} FROM sessions WHERE state IN ('starting', 'running') ORDER BY task_seq"
            )
        return [_session_from(r) for r in rows]

    async def update_sessions(self, changes: Sequence[SessionChange]) -> list[bool]:
        """Apply compare-and-set session updates in one transaction."""
        if not changes:
            return []
        out: list[bool] = []
        async with self._db.transaction() as conn:
            for change in changes:
                out.append(await conn.execute(_SESSION_CAS, _cas_args(change)) == 1)
        return out

    # Results ---------------------------------------------------------------------------------------------
    async def find_report(self, idempotency_key: str) -> bool:
        """Whether a report with this key exists."""
        async with self._db.connection() as conn:
            rows = await conn.fetch("SELECT 1 FROM reports WHERE idempotency_key = ?", (idempotency_key,))
        return bool(rows)

    async def _insert_report(self, conn: SqlConnection, result: ResultRecord, *, final: bool) -> None:
        await conn.execute(
            "INSERT INTO reports (idempotency_key, session_id, attempt, status, gateway_id, error_message, final, "
            "recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                result.idempotency_key,
                result.session_id,
                result.attempt,
                result.status.value,
                result.gateway_id,
                result.error_message,
                int(final),
                float(result.recorded_at),
            ),
        )

    async def record_attempt(self, result: ResultRecord, change: SessionChange) -> bool:
        """Record a retried attempt and move its session."""
        async with self._db.transaction() as conn:
            if await conn.execute(_SESSION_CAS, _cas_args(change)) != 1:
                return False
            await self._insert_report(conn, result, final=False)
        return True

    async def record_result(
        self, result: ResultRecord, change: SessionChange, delivery: DeliveryRecord | None
    ) -> ResultRecord | None:
        """Record a final result, finish the session and queue the delivery in one transaction."""
        async with self._db.transaction() as conn:
            if await conn.execute(_SESSION_CAS, _cas_args(change)) != 1:
                return None
            rows = await conn.fetch(
                "UPDATE tasks SET results_count = results_count + 1 WHERE task_id = ? RETURNING results_count",
                (result.task_id,),
            )
            result.result_index = int(rows[0][0]) - 1
            await self._insert_report(conn, result, final=True)
            await conn.execute(
                f"INSERT INTO results ({_RESULT_COLS.format(payload='payload')}) VALUES ({', '.join('?' * 16)})",
                (
                    result.session_id,
                    result.task_id,
                    result.sample_index,
                    result.status.value,
                    float(result.reward),
                    result.attempt,
                    result.gateway_id,
                    result.idempotency_key,
                    result.error_message,
                    float(result.duration_s),
                    result.calls,
                    result.chains,
                    json.dumps(result.policy_versions),
                    result.payload,
                    result.result_index,
                    float(result.recorded_at),
                ),
            )
            if result.policy_versions:
                await conn.executemany(
                    "INSERT INTO policy_versions (version) VALUES (?) ON CONFLICT (version) DO NOTHING",
                    [(v,) for v in result.policy_versions],
                )
            if delivery is not None:
                d = delivery
                await conn.execute(
                    f"INSERT INTO deliveries ({_DELIVERY_COLS}) VALUES ({', '.join('?' * 10)})",
                    (
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
                    ),
                )
        return result

    async def task_results(self, task_id: str, from_index: int = 0, *, payload: bool = True) -> list[ResultRecord]:
        """Return a task's results in completion order."""
        cols = _RESULT_COLS.format(payload="payload" if payload else "NULL")
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                f"SELECT {cols} FROM results WHERE task_id = ? AND result_index >= ? ORDER BY result_index",
                (task_id, from_index),
            )
        return [_result_from(r) for r in rows]

    async def get_result(self, session_id: str) -> ResultRecord | None:
        """Return a session's final result, or ``None``."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                f"SELECT {_RESULT_COLS.format(payload='payload')} FROM results WHERE session_id = ?", (session_id,)
            )
        return _result_from(rows[0]) if rows else None

    async def policy_versions(self) -> list[str]:
        """Return every policy version seen."""
        async with self._db.connection() as conn:
            rows = await conn.fetch("SELECT version FROM policy_versions")
        return [r[0] for r in rows]

    # Gateways --------------------------------------------------------------------------------------------
    async def upsert_gateway(self, gateway: GatewayRecord) -> None:
        """Insert or replace a gateway."""
        updates = ", ".join(f"{c} = excluded.{c}" for c in _GATEWAY_COLS.split(", ")[1:])
        async with self._db.transaction() as conn:
            await conn.execute(
                f"INSERT INTO gateways ({_GATEWAY_COLS}) VALUES ({', '.join('?' * 9)}) "
                f"ON CONFLICT (gateway_id) DO UPDATE SET {updates}",
                _gateway_row(gateway),
            )

    async def get_gateway(self, gateway_id: str) -> GatewayRecord | None:
        """Return a gateway, or ``None``."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(f"SELECT {_GATEWAY_COLS} FROM gateways WHERE gateway_id = ?", (gateway_id,))
        return _gateway_from(rows[0]) if rows else None

    async def list_gateways(self) -> list[GatewayRecord]:
        """Return every gateway by id."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(f"SELECT {_GATEWAY_COLS} FROM gateways ORDER BY gateway_id")
        return [_gateway_from(r) for r in rows]

    # Deliveries ------------------------------------------------------------------------------------------
    async def due_deliveries(self, now: float, limit: int) -> list[DeliveryRecord]:
        """Return pending deliveries due at ``now``."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                f"SELECT {_DELIVERY_COLS} FROM deliveries WHERE state = 'pending' AND next_attempt_at <= ? "
                "ORDER BY next_attempt_at LIMIT ?",
                (float(now), limit),
            )
        return [_delivery_from(r) for r in rows]

    async def update_delivery(self, delivery: DeliveryRecord, expected_attempts: int) -> bool:
        """Compare-and-set a delivery on its attempt count."""
        async with self._db.transaction() as conn:
            changed = await conn.execute(
                "UPDATE deliveries SET state = ?, attempts = ?, next_attempt_at = ?, last_error = ? "
                "WHERE idempotency_key = ? AND state = 'pending' AND attempts = ?",
                (
                    delivery.state.value,
                    delivery.attempts,
                    float(delivery.next_attempt_at),
                    delivery.last_error,
                    delivery.idempotency_key,
                    expected_attempts,
                ),
            )
        return changed == 1

    async def delivery_counts(self, task_id: str) -> dict[DeliveryState, int]:
        """Count a task's deliveries by state."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                "SELECT state, COUNT(*) FROM deliveries WHERE task_id = ? GROUP BY state", (task_id,)
            )
        return {DeliveryState(r[0]): int(r[1]) for r in rows}

    async def dead_letters(self, task_id: str) -> list[DeliveryRecord]:
        """Return a task's dead-lettered deliveries."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                f"SELECT {_DELIVERY_COLS} FROM deliveries WHERE task_id = ? AND state = 'dead'", (task_id,)
            )
        return [_delivery_from(r) for r in rows]

    # Policy and proxies ----------------------------------------------------------------------------------
    async def current_policy(self) -> PolicyRecord | None:
        """Return the highest stored policy version, or ``None``."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                "SELECT version, weights_path, updated_at FROM policies ORDER BY version DESC LIMIT 1"
            )
        return PolicyRecord(int(rows[0][0]), rows[0][1], float(rows[0][2])) if rows else None

    async def get_policy_update(self, version: int) -> PolicyUpdateRecord | None:
        """Return a stored version with its outcome, or ``None``."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                "SELECT version, weights_path, updated_at, outcome FROM policies WHERE version = ?", (version,)
            )
        if not rows:
            return None
        policy = PolicyRecord(int(rows[0][0]), rows[0][1], float(rows[0][2]))
        outcome = UpdateOutcome.from_json(policy, rows[0][3]) if rows[0][3] else None
        return PolicyUpdateRecord(policy, outcome)

    async def insert_policy(self, policy: PolicyRecord) -> bool:
        """Store ``policy`` unless a version at or above it exists."""
        async with self._db.transaction() as conn:
            higher = await conn.fetch("SELECT 1 FROM policies WHERE version >= ? LIMIT 1", (policy.version,))
            if higher:
                return False
            changed = await conn.execute(
                "INSERT INTO policies (version, weights_path, updated_at, outcome) VALUES (?, ?, ?, '') "
                "ON CONFLICT (version) DO NOTHING",
                (policy.version, policy.weights_path, float(policy.updated_at)),
            )
        return changed == 1

    async def set_policy_outcome(self, version: int, outcome: UpdateOutcome) -> None:
        """Store the outcome of a version's update."""
        async with self._db.transaction() as conn:
            await conn.execute("UPDATE policies SET outcome = ? WHERE version = ?", (outcome.to_json(), version))

    async def upsert_proxy(self, proxy: ProxyRecord) -> None:
        """Insert or replace a proxy."""
        updates = ", ".join(f"{c} = excluded.{c}" for c in _PROXY_COLS.split(", ")[1:])
        async with self._db.transaction() as conn:
            await conn.execute(
                f"INSERT INTO proxies ({_PROXY_COLS}) VALUES ({', '.join('?' * 7)}) "
                f"ON CONFLICT (proxy_id) DO UPDATE SET {updates}",
                (
                    proxy.proxy_id,
                    proxy.address,
                    proxy.backend,
                    proxy.version,
                    int(proxy.paused),
                    proxy.error,
                    float(proxy.registered_at),
                ),
            )

    async def set_proxy_state(self, proxy_id: str, *, version: int | None, paused: bool, error: str) -> None:
        """Record a proxy's update state."""
        async with self._db.transaction() as conn:
            if version is None:
                await conn.execute(
                    "UPDATE proxies SET paused = ?, error = ? WHERE proxy_id = ?", (int(paused), error, proxy_id)
                )
            else:
                await conn.execute(
                    "UPDATE proxies SET version = ?, paused = ?, error = ? WHERE proxy_id = ?",
                    (version, int(paused), error, proxy_id),
                )

    async def list_proxies(self) -> list[ProxyRecord]:
        """Return every proxy by id."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(f"SELECT {_PROXY_COLS} FROM proxies ORDER BY proxy_id")
        return [_proxy_from(r) for r in rows]
