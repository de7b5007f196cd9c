"""gRPC server of the RolloutService."""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.rollout.v1 import rollout_service_pb2, rollout_service_pb2_grpc

from polar_core.server import ServiceRegistration, placeholder_servicer, run_until_signal, start_grpc_server
from polar_core.tracing import create_tracer_provider
from rollout_server.settings import RolloutSettings

__all__ = ["create_server", "main"]

_SERVICE = rollout_service_pb2.DESCRIPTOR.services_by_name["RolloutService"]


async def create_server(
    settings: RolloutSettings, *, tracer_provider: TracerProvider | None = None
) -> tuple[grpc.aio.Server, int]:
    """Start the RolloutService on ``settings.host:settings.port`` (0 picks a port) and return it."""
    servicer = placeholder_servicer(
        rollout_service_pb2_grpc.RolloutServiceServicer,
        _SERVICE.full_name,
        [m.name for m in _SERVICE.methods],
        "issue #6",
    )
    registration = ServiceRegistration(
        _SERVICE.full_name,
        lambda server: rollout_service_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, server),
    )
    return await start_grpc_server(
        [registration],
        host=settings.host,
        port=settings.port,
        tracer_provider=tracer_provider,
        auth_token=settings.auth_token,
    )


def main() -> None:
    """Run the RolloutService until SIGTERM."""
    settings = RolloutSettings.load()
    provider = create_tracer_provider("rollout")
    asyncio.run(run_until_signal(lambda: create_server(settings, tracer_provider=provider), name="rollout"))
