"""One gateway as a Ray actor: the real GatewayService, its gRPC server in the actor's worker process.

Ray runs an actor whose methods are coroutines on an event loop of its own, which lives between calls: the
gateway's gRPC server, registration loop and sessions run there. Nothing here imports Ray; :mod:`.fleet` wraps
the class with ``ray.remote`` and places it. The settings (rollout address, tokens) arrive as data in
:meth:`GatewayActor.start`, never on a command line or in the environment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

from gateway.app import GatewayApp
from gateway.server import start_server
from gateway.settings import GatewaySettings
from polar_core.errors import FailedPrecondition
from polar_core.server import RunningService

__all__ = ["GatewayActor", "GatewayStarted"]


@dataclasses.dataclass(frozen=True, slots=True)
class GatewayStarted:
    """What a started gateway actor answers.

    Attributes:
        gateway_id: Its id with the rollout server.
        port: The port its GatewayService listens on.
        pid: Its worker process.
    """

    gateway_id: str
    port: int
    pid: int


class GatewayActor:
    """Runs one GatewayService in this process, from settings given as data."""

    def __init__(self) -> None:
        self._running: RunningService[GatewayApp] | None = None

    async def start(self, settings: dict[str, Any]) -> GatewayStarted:
        """Start the gateway from ``settings`` (``GatewaySettings`` fields; nothing is read from the environment).

        With a ``rollout_address`` it registers there by itself; :meth:`wait_registered` tells when.
        """
        if self._running is None:
            self._running = await start_server(GatewaySettings.model_validate(settings))
        return GatewayStarted(self._running.app.pipeline.gateway_id, self._running.port, os.getpid())

    async def wait_registered(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the first accepted registration with the rollout server."""
        membership = self._app().membership
        if membership is None:
            return False
        try:
            async with asyncio.timeout(timeout_s):
                await membership.registered.wait()
        except TimeoutError:
            return False
        return True

    async def ping(self) -> int:
        """Answer (the fleet's liveness check) with the sessions this gateway holds."""
        return self._app().pipeline.capacity().active

    async def drain(self, timeout_s: float) -> int:
        """Take no new session; wait up to ``timeout_s`` for the held ones to finish; return how many still run."""
        pipeline = self._app().pipeline
        pipeline.drain()
        return await pipeline.wait_idle(timeout_s)

    async def stop(self, grace_s: float) -> None:
        """Stop the sessions still held (handed back to the rollout server as outages, torn down within ``grace_s``),
        leave its pool and stop the server."""
        running, self._running = self._running, None
        if running is not None:
            await running.stop(grace_s)

    def _app(self) -> GatewayApp:
        if self._running is None:
            raise FailedPrecondition("the gateway actor has not started")
        return self._running.app
