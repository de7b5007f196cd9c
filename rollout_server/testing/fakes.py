"""In-process fakes of the rollout server's seams (no ports): gateways and a callback sender."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from polar_core.records import TerminalStatus
from rollout_server.errors import (
    DeliveryFailed,
    GatewayBusy,
    GatewayRejected,
    GatewaySessionUnknown,
    GatewayUnreachable,
)
from rollout_server.models import CallbackTarget, ResultRecord
from rollout_server.ports import CapacityView, GatewaySessionView, SessionDispatch

__all__ = ["FakeGatewayClient", "FakeSession", "ManualClock", "RecordingSender", "make_result"]


class ManualClock:
    """A clock the test moves by hand: ``clock.now += 5``; calling it reads the time."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def make_result(
    dispatch: SessionDispatch | None = None,
    *,
    session_id: str = "",
    attempt: int = 1,
    gateway_id: str = "",
    status: TerminalStatus = TerminalStatus.RESOLVED,
    reward: float = 1.0,
    policy_versions: list[str] | None = None,
) -> ResultRecord:
    """A result for ``dispatch`` (or the given session id and attempt) as a gateway would report it."""
    if dispatch is not None:
        session_id, attempt = dispatch.session_id, dispatch.attempt
    return ResultRecord(
        session_id=session_id,
        task_id=dispatch.task_id if dispatch else "",
        sample_index=dispatch.sample_index if dispatch else 0,
        status=status,
        reward=reward,
        attempt=attempt,
        gateway_id=gateway_id,
        idempotency_key=f"{session_id}#{attempt}",
        duration_s=2.0,
        calls=3,
        chains=1,
        policy_versions=list(policy_versions or []),
    )


@dataclasses.dataclass
class FakeSession:
    """A session a fake gateway holds."""

    dispatch: SessionDispatch
    done: bool = False
    cancelled: bool = False
    result: ResultRecord | None = None


class FakeGatewayClient:
    """Gateways held in memory by address; behaviour is steered per address through the public dicts."""

    def __init__(self) -> None:
        self.sessions: dict[str, dict[str, FakeSession]] = {}
        self.busy: dict[str, float | None] = {}  # address -> retry hint; present means "answer busy"
        self.unreachable: set[str] = set()
        self.rejecting: set[str] = set()
        self.capacities: dict[str, CapacityView] = {}
        self.started: list[tuple[str, SessionDispatch]] = []
        self.cancelled: list[tuple[str, str]] = []
        self.on_start: Callable[[str, SessionDispatch], None] | None = None

    async def start_session(self, address: str, dispatch: SessionDispatch) -> None:
        """Record the start, or fail as configured."""
        if address in self.unreachable:
            raise GatewayUnreachable(f"{address} is down")
        if address in self.busy:
            raise GatewayBusy(f"{address} is full", retry_after_s=self.busy[address])
        if address in self.rejecting:
            raise GatewayRejected(f"{address} rejects the spec")
        self.sessions.setdefault(address, {})[dispatch.session_id] = FakeSession(dispatch)
        self.started.append((address, dispatch))
        if self.on_start is not None:
            self.on_start(address, dispatch)

    async def get_session(self, address: str, session_id: str) -> GatewaySessionView:
        """Report a held session."""
        if address in self.unreachable:
            raise GatewayUnreachable(f"{address} is down")
        held = self.sessions.get(address, {}).get(session_id)
        if held is None:
            raise GatewaySessionUnknown(f"{address} does not know {session_id}")
        return GatewaySessionView(held.dispatch.attempt, held.done, held.result)

    async def cancel_session(self, address: str, session_id: str, reason: str) -> None:
        """Record the cancellation."""
        if address in self.unreachable:
            raise GatewayUnreachable(f"{address} is down")
        self.cancelled.append((address, session_id))
        held = self.sessions.get(address, {}).get(session_id)
        if held is None:
            raise GatewaySessionUnknown(session_id)
        held.cancelled = True

    async def get_capacity(self, address: str) -> CapacityView:
        """Return the configured capacity."""
        if address in self.unreachable or address not in self.capacities:
            raise GatewayUnreachable(f"{address} is down")
        return self.capacities[address]

    async def close(self) -> None:
        """Nothing to close."""

    def finish(self, address: str, session_id: str, result: ResultRecord) -> None:
        """Mark a held session done with ``result`` (as if the gateway finished it)."""
        held = self.sessions[address][session_id]
        held.done, held.result = True, result


class RecordingSender:
    """A callback sender that fails the first ``failures`` attempts of each key, then records deliveries."""

    def __init__(self, failures: int = 0, *, permanent: bool = False) -> None:
        self.failures = failures
        self.permanent = permanent
        self.attempts: dict[str, int] = {}
        self.delivered: list[tuple[CallbackTarget, ResultRecord, int]] = []

    async def deliver(self, target: CallbackTarget, result: ResultRecord, attempt: int) -> bool:
        """Fail or record."""
        n = self.attempts[result.idempotency_key] = self.attempts.get(result.idempotency_key, 0) + 1
        if n <= self.failures:
            raise DeliveryFailed("trainer is down", retryable=not self.permanent)
        self.delivered.append((target, result, attempt))
        return False

    async def close(self) -> None:
        """Nothing to close."""
