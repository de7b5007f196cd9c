"""A point-in-time picture of the whole rollout server: the read API behind its gauges (and any live view).

:func:`take_overview` reads counts, never rows (one ``GROUP BY`` per table, the gateway list and the fleet's
policy version), so it is cheap enough to take every few seconds on a server holding many tasks.
:class:`OverviewLoop` keeps the latest one; readers on other threads (the Prometheus scrape) see a complete
overview or the previous one, never a half-built one, because the attribute is replaced in one assignment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from rollout_server.models import DeliveryState, SessionState, TaskState
from rollout_server.ports import CurrentPolicyVersion
from rollout_server.store import Store

__all__ = ["GatewayLoad", "OverviewLoop", "RolloutOverview", "take_overview"]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class GatewayLoad:
    """One registered gateway as the scheduler sees it.

    Attributes:
        gateway_id: Its id.
        state: ``live``, ``draining`` or ``expired`` (its lease ran out).
        capacity: Its session slots.
        in_flight: Sessions assigned to it now (starting or running).
    """

    gateway_id: str
    state: str
    capacity: int
    in_flight: int

    @property
    def free(self) -> int:
        """Slots the scheduler may still fill (none on a draining or expired gateway)."""
        return max(self.capacity - self.in_flight, 0) if self.state == "live" else 0


@dataclasses.dataclass(frozen=True, slots=True)
class RolloutOverview:
    """Counts by state, the gateways' load and the fleet's policy version, at ``taken_at``."""

    taken_at: float = 0.0
    tasks: dict[TaskState, int] = dataclasses.field(default_factory=dict)
    sessions: dict[SessionState, int] = dataclasses.field(default_factory=dict)
    deliveries: dict[DeliveryState, int] = dataclasses.field(default_factory=dict)
    gateways: tuple[GatewayLoad, ...] = ()
    policy_version: int = 0


async def take_overview(store: Store, policy: CurrentPolicyVersion, clock: Callable[[], float]) -> RolloutOverview:
    """Read the overview from the store (counts only) and the fleet's current policy version."""
    now = clock()
    counts = await store.state_counts()
    gateways = []
    for g in await store.list_gateways():
        state = "draining" if g.draining else "live" if g.lease_expires_at > now else "expired"
        gateways.append(GatewayLoad(g.gateway_id, state, g.capacity, counts.in_flight_by_gateway.get(g.gateway_id, 0)))
    return RolloutOverview(
        taken_at=now,
        tasks=counts.tasks,
        sessions=counts.sessions,
        deliveries=counts.deliveries,
        gateways=tuple(gateways),
        policy_version=await policy.current_version(),
    )


class OverviewLoop:
    """Takes an overview every ``interval_s`` and keeps the latest in :attr:`latest`."""

    def __init__(
        self, store: Store, policy: CurrentPolicyVersion, clock: Callable[[], float], *, interval_s: float
    ) -> None:
        self._store = store
        self._policy = policy
        self._clock = clock
        self._interval_s = interval_s
        self.latest = RolloutOverview()

    async def refresh(self) -> RolloutOverview:
        """Take an overview now and keep it."""
        self.latest = await take_overview(self._store, self._policy, self._clock)
        return self.latest

    async def run(self) -> None:
        """Refresh forever; a failed refresh is logged and the previous overview kept."""
        while True:
            try:
                await self.refresh()
            except Exception:
                _log.exception("taking the rollout overview failed; keeping the previous one")
            await asyncio.sleep(self._interval_s)
