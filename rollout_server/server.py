"""gRPC server of the RolloutService."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.rollout.v1 import rollout_service_pb2, rollout_service_pb2_grpc

from polar_core.server import ManagedServer, ServiceRegistration, run_until_signal, start_service_server
from polar_core.tracing import create_tracer_provider
from rollout_server.app import RolloutApp
from rollout_server.servicer import RolloutServicer
from rollout_server.settings import RolloutSettings

__all__ = ["RolloutServer", "create_server", "main", "start_rollout_server"]

_SERVICE = rollout_service_pb2.DESCRIPTOR.services_by_name["RolloutService"]


@dataclasses.dataclass(slots=True)
class RolloutServer:
    """A running rollout server: the gRPC server, its port, and the app behind it."""

    server: grpc.aio.Server
    port: int
    app: RolloutApp

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving, then stop the background loops and close the store."""
        await self.server.stop(grace)
        await self.app.close()


async def start_rollout_server(
    settings: RolloutSettings, *, tracer_provider: TracerProvider | None = None, app: RolloutApp | None = None
) -> RolloutServer:
    """Open the app (reconciling with gateways), serve it, and start its loops."""
    app = app or await RolloutApp.open(settings, tracer_provider=tracer_provider)
    servicer = RolloutServicer(app.core, app.policy)
    registration = ServiceRegistration(
        _SERVICE.full_name,
        lambda server: rollout_service_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, server),
    )
    server, port = await start_service_server([registration], settings, tracer_provider=tracer_provider)
    await app.start()
    return RolloutServer(server, port, app)


async def create_server(
    settings: RolloutSettings, *, tracer_provider: TracerProvider | None = None
) -> tuple[grpc.aio.Server, int]:
    """Start the RolloutService on ``settings.host:settings.port`` (0 picks a port) and return it.

    Stopping the returned server also stops the app's loops and closes the store.
    """
    handle = await start_rollout_server(settings, tracer_provider=tracer_provider)
    return ManagedServer(handle.server, handle.app.close).as_server(), handle.port


def main() -> None:
    """Run the RolloutService until SIGTERM."""
    settings = RolloutSettings.load()
    provider = create_tracer_provider("rollout")
    asyncio.run(run_until_signal(lambda: create_server(settings, tracer_provider=provider), name="rollout"))
