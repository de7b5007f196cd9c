"""The seams of the rollout server's domain code: gateways, trainer callbacks, model proxies, the policy version.

The scheduler talks to gateways only through :class:`GatewayClient`, the deliverer to trainers only through
:class:`CallbackSender` and the policy coordinator to model proxies only through :class:`ProxyClient`; the gRPC
and HTTP implementations live in :mod:`rollout_server.clients`, and unit tests pass fakes. The core reads the
fleet's current policy version through :class:`CurrentPolicyVersion`.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from rollout_server.models import CallbackTarget, ResultRecord

__all__ = [
    "CallbackSender",
    "CapacityView",
    "CurrentPolicyVersion",
    "GatewayClient",
    "GatewaySessionView",
    "ProxyClient",
    "ProxyPolicyView",
    "SessionDispatch",
]


@dataclasses.dataclass(frozen=True, slots=True)
class SessionDispatch:
    """What a gateway needs to run one attempt of a session.

    Attributes:
        session_id: The session.
        task_id: Its task.
        sample_index: Its index within the task.
        attempt: The attempt number, from 1.
        deadline: Unix seconds by which the attempt must be done, evaluation included.
        task_spec: The serialised task, as submitted.
    """

    session_id: str
    task_id: str
    sample_index: int
    attempt: int
    deadline: float
    task_spec: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class GatewaySessionView:
    """A session as a gateway reports it.

    Attributes:
        attempt: The attempt the gateway runs or ran.
        done: Whether it reached a terminal status.
        result: Its result, when done.
    """

    attempt: int
    done: bool
    result: ResultRecord | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CapacityView:
    """A gateway's capacity as it reports it (``stage_metrics`` as in a heartbeat)."""

    gateway_id: str
    capacity: int
    active_sessions: int
    draining: bool
    stage_metrics: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)


class GatewayClient(Protocol):
    """Calls to gateways, by address. Implementations raise :mod:`rollout_server.errors` gateway errors."""

    async def start_session(self, address: str, dispatch: SessionDispatch) -> None:
        """Start one attempt; idempotent by (session, attempt).

        Raises:
            GatewayBusy: The gateway is full.
            GatewayRejected: The gateway refused the session.
            GatewayUnreachable: No answer; the attempt may or may not have started.
        """

    async def get_session(self, address: str, session_id: str) -> GatewaySessionView:
        """Read a session. Raises ``GatewaySessionUnknown`` or ``GatewayUnreachable``."""

    async def cancel_session(self, address: str, session_id: str, reason: str) -> None:
        """Stop a session. Raises ``GatewaySessionUnknown`` or ``GatewayUnreachable``."""

    async def get_capacity(self, address: str) -> CapacityView:
        """Read the gateway's capacity. Raises ``GatewayUnreachable``."""

    async def close(self) -> None:
        """Close connections."""


class CallbackSender(Protocol):
    """Pushes one session result to a trainer."""

    async def deliver(self, target: CallbackTarget, result: ResultRecord, attempt: int) -> bool:
        """Deliver ``result`` (keyed by its idempotency key); return whether the trainer had it already.

        Raises:
            DeliveryFailed: With ``retryable`` false when the trainer rejected the result for good.
        """

    async def close(self) -> None:
        """Close connections."""


@dataclasses.dataclass(frozen=True, slots=True)
class ProxyPolicyView:
    """A model proxy's policy as it reports it (ModelProxyService.GetPolicy), its version read back as a number."""

    policy_version: int
    weights_path: str
    paused: bool
    in_flight: int


class ProxyClient(Protocol):
    """Calls to model proxies, by address. Implementations raise :mod:`polar_core.errors` errors.

    ``Unavailable`` (or ``DeadlineExceeded``) means the proxy did not answer; ``FailedPrecondition`` that it
    refused (a rejected checkpoint, a failed load).
    """

    async def check_weights(self, address: str, weights_path: str) -> str:
        """Check a checkpoint without loading it; return its architecture name."""

    async def pause(self, address: str, *, abort_in_flight: bool, drain_timeout_s: float) -> tuple[int, int]:
        """Pause generation; return (calls in flight when it began, calls aborted)."""

    async def load_weights(self, address: str, policy_version: int, weights_path: str) -> float:
        """Load a checkpoint (generation paused) and set the version; return the load's seconds."""

    async def set_policy_version(self, address: str, policy_version: int) -> None:
        """Stamp a version without loading weights (the trainer synced them into the proxy's backend)."""

    async def resume(self, address: str) -> int:
        """Resume generation; return how many held calls were released."""

    async def get_policy(self, address: str) -> ProxyPolicyView:
        """Read the proxy's policy."""

    async def close(self) -> None:
        """Close connections."""


class CurrentPolicyVersion(Protocol):
    """The fleet's current policy version, as staleness is measured against it."""

    async def current_version(self) -> int:
        """The current version (an integer from 1; 0 when no version is known)."""
