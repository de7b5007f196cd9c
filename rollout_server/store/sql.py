"""One SQL implementation of :class:`~rollout_server.store.base.Store` over a tiny driver seam.

SQLite and PostgreSQL differ here only in a few column types, the autoincrement column, and placeholders
(``?`` vs ``$1``); each backend module supplies a :class:`SqlBackend` and the dialect's type names.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from rollout_server.models import (
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
from rollout_server.store.base import SessionChange, StateCounts
from rollout_server.store.rows import (
    DELIVERY_COLS,
    GATEWAY_COLS,
    POLICY_COLS,
    PROXY_COLS,
    REPORT_COLS,
    RESULT_COLS,
    SESSION_COLS,
    TASK_COLS,
    TASK_SELECT,
    Row,
    delivery_from,
    delivery_row,
    gateway_from,
    gateway_row,
    opt_float,
    policy_from,
    policy_row,
    proxy_from,
    proxy_row,
    report_row,
    result_from,
    result_row,
    session_from,
    session_row,
    task_from,
    task_row,
)

__all__ = ["SqlBackend", "SqlConnection", "SqlStore", "schema"]


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
  trace_context TEXT NOT NULL DEFAULT '',
  max_policy_lag {int},
  stale_policy TEXT NOT NULL DEFAULT 'keep'
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
  task_seq {int} NOT NULL,
  stale_resamples {int} NOT NULL DEFAULT 0,
  outages {int} NOT NULL DEFAULT 0
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
  policy_lag {int} NOT NULL DEFAULT 0,
  fleet_version {int} NOT NULL DEFAULT 0,
  harness_exit_code {int},
  dependency_unavailable {int} NOT NULL DEFAULT 0,
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
ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("tasks", "trace_context", "TEXT NOT NULL DEFAULT ''"),
    ("tasks", "max_policy_lag", "{int}"),
    ("tasks", "stale_policy", "TEXT NOT NULL DEFAULT 'keep'"),
    ("sessions", "stale_resamples", "{int} NOT NULL DEFAULT 0"),
    ("sessions", "outages", "{int} NOT NULL DEFAULT 0"),
    ("results", "policy_lag", "{int} NOT NULL DEFAULT 0"),
    ("results", "fleet_version", "{int} NOT NULL DEFAULT 0"),
    ("results", "harness_exit_code", "{int}"),
    ("results", "dependency_unavailable", "{int} NOT NULL DEFAULT 0"),
)


_SESSION_CAS = (
    "UPDATE sessions SET state = ?, attempt = ?, infra_failures = ?, gateway_id = ?, not_before = ?, "
    "dispatched_at = ?, deadline = ?, stale_resamples = ?, outages = ? WHERE session_id = ? AND state = ? "
    "AND attempt = ?"
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
        opt_float(new.dispatched_at),
        opt_float(new.deadline),
        new.stale_resamples,
        new.outages,
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
                    await conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition.format(**self._db.types)}")

    async def close(self) -> None:
        """Close the backend."""
        await self._db.close()

    # Tasks -----------------------------------------------------------------------------------------------
    async def insert_task(self, task: TaskRecord, sessions: Sequence[SessionRecord]) -> tuple[TaskRecord, bool]:
        """Insert a task and its sessions unless the id exists."""
        async with self._db.transaction() as conn:
            rows = await conn.fetch(
                f"INSERT INTO tasks ({TASK_COLS}) VALUES ({', '.join('?' * 18)}) "
                "ON CONFLICT (task_id) DO NOTHING RETURNING seq",
                task_row(task),
            )
            if not rows:
                existing = await conn.fetch(f"{TASK_SELECT} WHERE task_id = ?", (task.task_id,))
                return task_from(existing[0]), False
            seq = int(rows[0][0])
            for s in sessions:
                s.task_seq = seq
            await conn.executemany(
                f"INSERT INTO sessions ({SESSION_COLS}) VALUES ({', '.join('?' * 14)})",
                [session_row(s) for s in sessions],
            )
        task.seq = seq
        return task, True

    async def get_task(self, task_id: str) -> TaskRecord | None:
        """Return a task, or ``None``."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(f"{TASK_SELECT} WHERE task_id = ?", (task_id,))
        return task_from(rows[0]) if rows else None

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
            rows = await conn.fetch(f"{TASK_SELECT}{clause} ORDER BY seq DESC LIMIT ?", (*args, limit))
        return [task_from(r) for r in rows]

    async def active_tasks(self) -> list[TaskRecord]:
        """Return pending and running tasks, oldest first."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(f"{TASK_SELECT} WHERE state IN ('pending', 'running') ORDER BY seq")
        return [task_from(r) for r in rows]

    async def count_active_tasks(self) -> int:
        """Count pending and running tasks (no task row is read)."""
        async with self._db.connection() as conn:
            rows = await conn.fetch("SELECT COUNT(*) FROM tasks WHERE state IN ('pending', 'running')")
        return int(rows[0][0])

    async def state_counts(self) -> StateCounts:
        """Count rows by state with one ``GROUP BY`` per table (no row is read)."""
        async with self._db.connection() as conn:
            tasks = await conn.fetch("SELECT state, COUNT(*) FROM tasks GROUP BY state")
            sessions = await conn.fetch("SELECT state, COUNT(*) FROM sessions GROUP BY state")
            deliveries = await conn.fetch("SELECT state, COUNT(*) FROM deliveries GROUP BY state")
            gateways = await conn.fetch(
                "SELECT gateway_id, COUNT(*) FROM sessions WHERE state IN ('starting', 'running') GROUP BY gateway_id"
            )
        return StateCounts(
            tasks={TaskState(r[0]): int(r[1]) for r in tasks},
            sessions={SessionState(r[0]): int(r[1]) for r in sessions},
            deliveries={DeliveryState(r[0]): int(r[1]) for r in deliveries},
            in_flight_by_gateway={str(r[0]): int(r[1]) for r in gateways},
        )

    async def set_task_state(
        self, task_id: str, expected: TaskState, new: TaskState, *, finished_at: float | None, error_message: str
    ) -> bool:
        """Compare-and-set a task's state."""
        check_task_transition(expected, new)
        async with self._db.transaction() as conn:
            changed = await conn.execute(
                "UPDATE tasks SET state = ?, finished_at = ?, error_message = ? WHERE task_id = ? AND state = ?",
                (new.value, opt_float(finished_at), error_message, task_id, expected.value),
            )
        return changed == 1

    # Sessions --------------------------------------------------------------------------------------------
    async def get_session(self, session_id: str) -> SessionRecord | None:
        """Return a session, or ``None``."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(f"SELECT {SESSION_COLS} FROM sessions WHERE session_id = ?", (session_id,))
        return session_from(rows[0]) if rows else None

    async def task_sessions(self, task_id: str) -> list[SessionRecord]:
        """Return a task's sessions by sample index."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                f"SELECT {SESSION_COLS} FROM sessions WHERE task_id = ? ORDER BY sample_index", (task_id,)
            )
        return [session_from(r) for r in rows]

    async def dispatchable_sessions(self, now: float, limit: int) -> list[SessionRecord]:
        """Return due pending sessions in dispatch order."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                f"SELECT {SESSION_COLS} FROM sessions WHERE state = 'pending' AND not_before <= ? "
                "ORDER BY priority DESC, task_seq, sample_index LIMIT ?",
                (float(now), limit),
            )
        return [session_from(r) for r in rows]

    async def in_flight_sessions(self) -> list[SessionRecord]:
        """Return starting and running sessions."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                f"SELECT {SESSION_COLS} FROM sessions WHERE state IN ('starting', 'running') ORDER BY task_seq"
            )
        return [session_from(r) for r in rows]

    async def in_flight_counts(self) -> dict[str, int]:
        """Count starting and running sessions by gateway (the database counts: no session row is read)."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                "SELECT gateway_id, COUNT(*) FROM sessions WHERE state IN ('starting', 'running') GROUP BY gateway_id"
            )
        return {str(r[0]): int(r[1]) for r in rows}

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
            f"INSERT INTO reports ({REPORT_COLS}) VALUES ({', '.join('?' * 8)})",
            report_row(result, final=final),
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
                f"INSERT INTO results ({RESULT_COLS.format(payload='payload')}) VALUES ({', '.join('?' * 20)})",
                result_row(result),
            )
            if result.policy_versions:
                await conn.executemany(
                    "INSERT INTO policy_versions (version) VALUES (?) ON CONFLICT (version) DO NOTHING",
                    [(v,) for v in result.policy_versions],
                )
            if delivery is not None:
                await conn.execute(
                    f"INSERT INTO deliveries ({DELIVERY_COLS}) VALUES ({', '.join('?' * 10)})",
                    delivery_row(delivery),
                )
        return result

    async def task_results(
        self, task_id: str, from_index: int = 0, *, payload: bool = True, limit: int = 0
    ) -> list[ResultRecord]:
        """Return a task's results in completion order (at most ``limit`` of them unless it is 0)."""
        cols = RESULT_COLS.format(payload="payload" if payload else "NULL")
        query = f"SELECT {cols} FROM results WHERE task_id = ? AND result_index >= ? ORDER BY result_index"
        params: tuple[str | int, ...] = (task_id, from_index)
        if limit > 0:
            query += " LIMIT ?"
            params = (*params, limit)
        async with self._db.connection() as conn:
            rows = await conn.fetch(query, params)
        return [result_from(r) for r in rows]

    async def get_result(self, session_id: str) -> ResultRecord | None:
        """Return a session's final result, or ``None``."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                f"SELECT {RESULT_COLS.format(payload='payload')} FROM results WHERE session_id = ?", (session_id,)
            )
        return result_from(rows[0]) if rows else None

    async def policy_versions(self) -> list[str]:
        """Return every policy version seen."""
        async with self._db.connection() as conn:
            rows = await conn.fetch("SELECT version FROM policy_versions")
        return [r[0] for r in rows]

    # Gateways --------------------------------------------------------------------------------------------
    async def upsert_gateway(self, gateway: GatewayRecord) -> None:
        """Insert or replace a gateway."""
        updates = ", ".join(f"{c} = excluded.{c}" for c in GATEWAY_COLS.split(", ")[1:])
        async with self._db.transaction() as conn:
            await conn.execute(
                f"INSERT INTO gateways ({GATEWAY_COLS}) VALUES ({', '.join('?' * 9)}) "
                f"ON CONFLICT (gateway_id) DO UPDATE SET {updates}",
                gateway_row(gateway),
            )

    async def get_gateway(self, gateway_id: str) -> GatewayRecord | None:
        """Return a gateway, or ``None``."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(f"SELECT {GATEWAY_COLS} FROM gateways WHERE gateway_id = ?", (gateway_id,))
        return gateway_from(rows[0]) if rows else None

    async def list_gateways(self) -> list[GatewayRecord]:
        """Return every gateway by id."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(f"SELECT {GATEWAY_COLS} FROM gateways ORDER BY gateway_id")
        return [gateway_from(r) for r in rows]

    # Deliveries ------------------------------------------------------------------------------------------
    async def due_deliveries(self, now: float, limit: int) -> list[DeliveryRecord]:
        """Return pending deliveries due at ``now``."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(
                f"SELECT {DELIVERY_COLS} FROM deliveries WHERE state = 'pending' AND next_attempt_at <= ? "
                "ORDER BY next_attempt_at LIMIT ?",
                (float(now), limit),
            )
        return [delivery_from(r) for r in rows]

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
                f"SELECT {DELIVERY_COLS} FROM deliveries WHERE task_id = ? AND state = 'dead'", (task_id,)
            )
        return [delivery_from(r) for r in rows]

    # Policy and proxies ----------------------------------------------------------------------------------
    async def current_policy(self) -> PolicyRecord | None:
        """Return the highest stored policy version, or ``None``."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(f"SELECT {POLICY_COLS} FROM policies ORDER BY version DESC LIMIT 1")
        return policy_from(rows[0]) if rows else None

    async def get_policy_update(self, version: int) -> PolicyUpdateRecord | None:
        """Return a stored version with its outcome, or ``None``."""
        async with self._db.connection() as conn:
            rows = await conn.fetch(f"SELECT {POLICY_COLS}, outcome FROM policies WHERE version = ?", (version,))
        if not rows:
            return None
        policy = policy_from(rows[0])
        outcome = UpdateOutcome.from_json(policy, rows[0][3]) if rows[0][3] else None
        return PolicyUpdateRecord(policy, outcome)

    async def insert_policy(self, policy: PolicyRecord) -> bool:
        """Store ``policy`` unless a version at or above it exists."""
        async with self._db.transaction() as conn:
            higher = await conn.fetch("SELECT 1 FROM policies WHERE version >= ? LIMIT 1", (policy.version,))
            if higher:
                return False
            changed = await conn.execute(
                f"INSERT INTO policies ({POLICY_COLS}, outcome) VALUES (?, ?, ?, '') ON CONFLICT (version) DO NOTHING",
                policy_row(policy),
            )
        return changed == 1

    async def set_policy_outcome(self, version: int, outcome: UpdateOutcome) -> None:
        """Store the outcome of a version's update."""
        async with self._db.transaction() as conn:
            await conn.execute("UPDATE policies SET outcome = ? WHERE version = ?", (outcome.to_json(), version))

    async def upsert_proxy(self, proxy: ProxyRecord) -> None:
        """Insert or replace a proxy."""
        updates = ", ".join(f"{c} = excluded.{c}" for c in PROXY_COLS.split(", ")[1:])
        async with self._db.transaction() as conn:
            await conn.execute(
                f"INSERT INTO proxies ({PROXY_COLS}) VALUES ({', '.join('?' * len(PROXY_COLS.split(', ')))}) "
                f"ON CONFLICT (proxy_id) DO UPDATE SET {updates}",
                proxy_row(proxy),
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
            rows = await conn.fetch(f"SELECT {PROXY_COLS} FROM proxies ORDER BY proxy_id")
        return [proxy_from(r) for r in rows]
