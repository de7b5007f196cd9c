"""Membership in a rollout server's fleet: register at start and serve the fleet's policy before any call.

With ``rollout_address`` set, the proxy's generation gate starts paused. :class:`FleetMembership` calls
``RegisterProxy``; when the fleet's version is above 0 it loads that checkpoint and takes that version, and only
then opens the gate. When registering or loading fails the gate stays shut, the error is logged, and it tries
again with a doubling backoff: a proxy never answers a call with weights the fleet has moved on from.

The rollout server stores a version only once a proxy has loaded it, so the version handed out here loads
somewhere. When this proxy's backend refuses it anyway (``FailedPrecondition``: the checkpoint does not fit, or
the load failed), that version and path are not loaded again: the proxy keeps registering with the backoff and
loads only a version it has not been refused, or the next UpdatePolicy drives it. It never loops on reloading a
checkpoint that failed.

Domain code: the RPC is behind the :class:`Registrar` protocol (:mod:`model_proxy.rollout_client`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Protocol

from model_proxy.core.gate import GenerationGate
from model_proxy.weights import WeightManager
from polar_core.errors import FailedPrecondition, InvalidArgument, PolarError

__all__ = ["FleetMembership", "FleetPolicy", "Registrar"]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class FleetPolicy:
    """The policy the rollout server hands a registering proxy (version 0: keep the configured one)."""

    version: int
    weights_path: str


class Registrar(Protocol):
    """The rollout server's RegisterProxy."""

    async def register(self, proxy_id: str, address: str, backend: str) -> FleetPolicy:
        """Add or refresh this proxy; return the policy it must serve."""
        ...

    async def close(self) -> None:
        """Close the connection."""
        ...


class FleetMembership:
    """Joins one proxy to the fleet of one rollout server.

    Args:
        weights: The proxy's weight manager.
        gate: The engine's generation gate (paused until the fleet's policy is served).
        registrar: The rollout server's RPC.
        proxy_id: The id this proxy registers under.
        address: Where the rollout server reaches this proxy's ModelProxyService.
        backend: The backend's name.
        retry_s: First delay after a failure; doubles up to ``retry_max_s``.
        retry_max_s: Longest delay between attempts.

    Attributes:
        ready: Set once the fleet's policy is served and the gate is open.
        policy: The fleet policy last received.
        last_error: The last failure, for people and tests; empty once ready.
        refused: The fleet policy this proxy's backend refused to load, which it does not try again.
    """

    def __init__(
        self,
        weights: WeightManager,
        gate: GenerationGate,
        registrar: Registrar,
        *,
        proxy_id: str,
        address: str,
        backend: str,
        retry_s: float = 0.5,
        retry_max_s: float = 30.0,
    ) -> None:
        self._weights = weights
        self._gate = gate
        self._registrar = registrar
        self.proxy_id = proxy_id
        self.address = address
        self._backend = backend
        self._retry_s = retry_s
        self._retry_max_s = retry_max_s
        self._task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.policy: FleetPolicy | None = None
        self.last_error = ""
        self.refused: FleetPolicy | None = None

    def start(self) -> None:
        """Start joining in the background (the gate must already be paused)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="proxy-fleet-membership")

    async def stop(self) -> None:
        """Stop trying and close the connection (idempotent)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._registrar.close()

    async def _run(self) -> None:
        delay = self._retry_s
        while True:
            try:
                await self._join()
            except (PolarError, OSError) as exc:
                message = getattr(exc, "message", None) or str(exc)
                self.last_error = message
                _log.error(
                    "proxy %s stays PAUSED: joining the fleet failed (retry in %.1f s): %s",
                    self.proxy_id,
                    delay,
                    message,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry_max_s)
                continue
            self.last_error = ""
            self.ready.set()
            return

    async def _join(self) -> None:
        policy = await self._registrar.register(self.proxy_id, self.address, self._backend)
        self.policy = policy
        refused = self.refused
        # An update may have reached this proxy since it registered; never go back from a newer version.
        behind = policy.version > 0 and self._weights.version_number < policy.version
        if behind and refused == policy:
            raise FailedPrecondition(
                f"the fleet's policy version {policy.version} ({policy.weights_path!r}) was refused by this "
                "proxy's backend; it is not loaded again, waiting for another version"
            )
        try:
            await self._weights.join(policy.version, policy.weights_path)
        except (FailedPrecondition, InvalidArgument):
            self.refused = policy
            raise
        _log.info(
            "proxy %s joined the fleet at %s serving policy version %s",
            self.proxy_id,
            self.address,
            self._weights.served().policy_version,
        )
