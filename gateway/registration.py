"""Membership in a rollout server's pool: RegisterGateway at start, then Heartbeat with capacity and stage load.

The rollout server schedules onto registered gateways whose lease is fresh. :class:`RegistrationLoop` registers
(retrying until the rollout server answers), heartbeats every ``heartbeat_interval`` it was given, registers
again when the server has forgotten the gateway (``NotFound``, e.g. after its lease lapsed), drains the pipeline
when the server asks (``drain_requested``, after DrainGateway), and cancels the sessions the server cancelled.

Domain code: the RPCs are behind the :class:`Registrar` protocol (:class:`gateway.clients.GrpcRolloutRegistrar`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from gateway.errors import SessionNotFound
from gateway.models import Capacity
from polar_core.errors import NotFound, PolarError

if TYPE_CHECKING:
    from gateway.core import SessionPipeline

__all__ = ["HeartbeatReply", "Lease", "Registrar", "RegistrationLoop"]

_log = logging.getLogger(__name__)
_RETRY_MAX_S = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """What RegisterGateway answers: how often to heartbeat and how long the registration lives without one."""

    heartbeat_interval_s: float
    lease_ttl_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class HeartbeatReply:
    """What Heartbeat answers."""

    drain_requested: bool = False
    cancelled_session_ids: tuple[str, ...] = ()


class Registrar(Protocol):
    """The rollout server's gateway-pool RPCs."""

    async def register(
        self, gateway_id: str, address: str, capacity: int, labels: dict[str, str], version: str
    ) -> Lease:
        """Add or refresh this gateway's registration."""
        ...

    async def heartbeat(self, capacity: Capacity) -> HeartbeatReply:
        """Renew the lease and report load; raises ``NotFound`` when the gateway is not registered."""
        ...


class RegistrationLoop:
    """Keeps one gateway registered with one rollout server.

    Args:
        pipeline: The gateway's pipeline (capacity, drain, cancel).
        registrar: The rollout server's RPCs.
        address: ``host:port`` where the rollout server reaches this gateway's GatewayService.
        labels: Placement labels sent with the registration.
        version: This gateway's software version.
        default_interval_s: Heartbeat interval until the server names one.

    Attributes:
        registered: Set once the first registration succeeded.
        beat: Set after every acknowledged heartbeat (tests clear and await it).
        heartbeats: Acknowledged heartbeats so far.
    """

    def __init__(
        self,
        pipeline: SessionPipeline,
        registrar: Registrar,
        *,
        address: str,
        labels: Mapping[str, str] | None = None,
        version: str = "",
        default_interval_s: float = 5.0,
    ) -> None:
        self._pipeline = pipeline
        self._registrar = registrar
        self._address = address
        self._labels = dict(labels or {})
        self._version = version
        self._interval_s = default_interval_s
        self._task: asyncio.Task[None] | None = None
        self.registered = asyncio.Event()
        self.beat = asyncio.Event()
        self.heartbeats = 0

    def start(self) -> None:
        """Start registering and heartbeating in the background."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="gateway-registration")

    async def stop(self) -> None:
        """Stop heartbeating (the rollout server lets the lease lapse). Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def announce(self, timeout_s: float = 5.0) -> None:
        """Heartbeat now, outside the schedule (after :meth:`SessionPipeline.drain`, so the rollout server stops
        dispatching here before the sessions are handed back); a failure is only logged."""
        if not self.registered.is_set():
            return
        try:
            await asyncio.wait_for(self._registrar.heartbeat(self._pipeline.capacity()), timeout_s)
        except (PolarError, OSError, TimeoutError) as exc:
            _log.warning("telling the rollout server that gateway %s drains failed: %s", self._pipeline.gateway_id, exc)

    async def _run(self) -> None:
        await self._register()
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                reply = await self._registrar.heartbeat(self._pipeline.capacity())
            except NotFound:
                _log.warning("the rollout server forgot gateway %s; registering again", self._pipeline.gateway_id)
                await self._register()
                continue
            except (PolarError, OSError) as exc:
                _log.warning("heartbeat to the rollout server failed: %s", exc)
                continue
            self.heartbeats += 1
            self.beat.set()
            self._apply(reply)

    async def _register(self) -> None:
        delay = 0.5
        while True:
            capacity = self._pipeline.capacity()
            try:
                lease = await self._registrar.register(
                    capacity.gateway_id, self._address, capacity.capacity, self._labels, self._version
                )
            except (PolarError, OSError) as exc:
                _log.warning("registering with the rollout server failed (retry in %.1f s): %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_S)
                continue
            if lease.heartbeat_interval_s > 0:
                self._interval_s = lease.heartbeat_interval_s
            _log.info("registered gateway %s at %s", capacity.gateway_id, self._address)
            self.registered.set()
            return

    def _apply(self, reply: HeartbeatReply) -> None:
        if reply.drain_requested and not self._pipeline.capacity().draining:
            _log.info("the rollout server asked gateway %s to drain", self._pipeline.gateway_id)
            self._pipeline.drain()
        for session_id in reply.cancelled_session_ids:
            with contextlib.suppress(SessionNotFound):
                self._pipeline.cancel_session(session_id, "cancelled by the rollout server")
