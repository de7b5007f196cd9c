"""The ``Store`` protocol: everything the rollout server persists, behind one seam.

Every method that changes state is one transaction. Updates of sessions and deliveries are compare-and-set on
the state the caller read (and the attempt number), so two rollout servers sharing one PostgreSQL database
never both act on one session, and a caller that loses the race simply re-reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

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
)

__all__ = ["SessionChange", "StateCounts", "Store"]

# (new session row, expected current state, expected current attempt)
SessionChange = tuple[SessionRecord, SessionState, int]


@dataclasses.dataclass(frozen=True, slots=True)
class StateCounts:
    """How many rows of each kind are in each state (states with none are absent)."""

    tasks: dict[TaskState, int]
    sessions: dict[SessionState, int]
    deliveries: dict[DeliveryState, int]
    in_flight_by_gateway: dict[str, int]


class Store(Protocol):
    """Durable state of the rollout server: tasks, sessions, results, gateways, the delivery outbox and the policy."""

    async def init(self) -> None:
        """Create the schema if it does not exist (idempotent)."""

    async def close(self) -> None:
        """Release connections."""

    # Tasks -----------------------------------------------------------------------------------------------
    async def insert_task(self, task: TaskRecord, sessions: Sequence[SessionRecord]) -> tuple[TaskRecord, bool]:
        """Insert a task and its sessions unless the id exists; return the stored task and whether it was new."""

    async def get_task(self, task_id: str) -> TaskRecord | None:
        """Return a task, or ``None``."""

    async def list_tasks(self, limit: int, before_seq: int | None, state: TaskState | None) -> list[TaskRecord]:
        """Return up to ``limit`` tasks newest first, with ``seq < before_seq`` when given."""

    async def active_tasks(self) -> list[TaskRecord]:
        """Return the tasks that are pending or running."""

    async def count_active_tasks(self) -> int:
        """Count the tasks that are pending or running."""

    async def state_counts(self) -> StateCounts:
        """Count tasks, sessions and deliveries by state, and in-flight sessions by gateway (metrics, overview)."""

    async def set_task_state(
        self, task_id: str, expected: TaskState, new: TaskState, *, finished_at: float | None, error_message: str
    ) -> bool:
        """Move a task from ``expected`` to ``new``; ``False`` when it was no longer in ``expected``."""

    # Sessions --------------------------------------------------------------------------------------------
    async def get_session(self, session_id: str) -> SessionRecord | None:
        """Return a session, or ``None``."""

    async def task_sessions(self, task_id: str) -> list[SessionRecord]:
        """Return a task's sessions by sample index."""

    async def dispatchable_sessions(self, now: float, limit: int) -> list[SessionRecord]:
        """Return pending sessions of active tasks due at ``now``: priority high first, then oldest task."""

    async def in_flight_sessions(self) -> list[SessionRecord]:
        """Return the sessions a gateway may be running (starting or running)."""

    async def in_flight_counts(self) -> dict[str, int]:
        """Count the sessions each gateway may be running (starting or running), by gateway id."""

    async def update_sessions(self, changes: Sequence[SessionChange]) -> list[bool]:
        """Apply compare-and-set session updates in one transaction; ``False`` where the row had moved on."""

    # Results ---------------------------------------------------------------------------------------------
    async def find_report(self, idempotency_key: str) -> bool:
        """Whether a result (final or retried) with this key was already recorded."""

    async def record_attempt(self, result: ResultRecord, change: SessionChange) -> bool:
        """Record a non-final attempt result (retried infra_error) and apply ``change``; ``False`` on a lost race."""

    async def record_result(
        self, result: ResultRecord, change: SessionChange, delivery: DeliveryRecord | None
    ) -> ResultRecord | None:
        """Record a session's final result, finish the session and queue its delivery, atomically.

        Returns the result with ``result_index`` assigned, or ``None`` when ``change`` lost a race.
        """

    async def task_results(
        self, task_id: str, from_index: int = 0, *, payload: bool = True, limit: int = 0
    ) -> list[ResultRecord]:
        """Return a task's results from ``from_index`` on, in completion order; at most ``limit`` unless 0."""

    async def get_result(self, session_id: str) -> ResultRecord | None:
        """Return a session's final result, or ``None``."""

    async def policy_versions(self) -> list[str]:
        """Return every policy version seen in any result."""

    # Gateways --------------------------------------------------------------------------------------------
    async def upsert_gateway(self, gateway: GatewayRecord) -> None:
        """Insert or replace a gateway."""

    async def get_gateway(self, gateway_id: str) -> GatewayRecord | None:
        """Return a gateway, or ``None``."""

    async def list_gateways(self) -> list[GatewayRecord]:
        """Return every gateway."""

    # Deliveries ------------------------------------------------------------------------------------------
    async def due_deliveries(self, now: float, limit: int) -> list[DeliveryRecord]:
        """Return pending deliveries due at ``now``, oldest first."""

    async def update_delivery(self, delivery: DeliveryRecord, expected_attempts: int) -> bool:
        """Compare-and-set a delivery on its attempt count; ``False`` when another worker moved it on."""

    async def delivery_counts(self, task_id: str) -> dict[DeliveryState, int]:
        """Count a task's deliveries by state."""

    async def dead_letters(self, task_id: str) -> list[DeliveryRecord]:
        """Return a task's dead-lettered deliveries."""

    # Policy and proxies ----------------------------------------------------------------------------------
    async def current_policy(self) -> PolicyRecord | None:
        """Return the highest stored policy version, or ``None`` before the first update."""

    async def get_policy_update(self, version: int) -> PolicyUpdateRecord | None:
        """Return a stored version with its update's outcome, or ``None``."""

    async def insert_policy(self, policy: PolicyRecord) -> bool:
        """Store ``policy`` as current unless a version at or above it exists; ``False`` when one does."""

    async def set_policy_outcome(self, version: int, outcome: UpdateOutcome) -> None:
        """Store the outcome of a version's update (replacing an earlier one)."""

    async def upsert_proxy(self, proxy: ProxyRecord) -> None:
        """Insert or replace a proxy."""

    async def set_proxy_state(self, proxy_id: str, *, version: int | None, paused: bool, error: str) -> None:
        """Record a proxy's update state (``version`` ``None`` keeps the stored one); unknown ids are ignored."""

    async def list_proxies(self) -> list[ProxyRecord]:
        """Return every proxy by id."""
