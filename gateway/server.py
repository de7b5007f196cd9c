"""gRPC server of the GatewayService."""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.gateway.v1 import gateway_service_pb2, gateway_service_pb2_grpc

from gateway.settings import GatewaySettings
from polar_core.server import ServiceRegistration, placeholder_servicer, run_until_signal, start_grpc_server
from polar_core.tracing import create_tracer_provider

__all__ = ["create_server", "main"]

_SERVICE = gateway_service_pb2.DESCRIPTOR.services_by_name["GatewayService"]


async def create_server(
    settings: GatewaySettings, *, tracer_provider: TracerProvider | None = None
) -> tuple[grpc.aio.Server, int]:
    """Start the GatewayService on ``settings.host:settings.port`` (0 picks a port) and return it."""
    servicer = placeholder_servicer(
        gateway_service_pb2_grpc.GatewayServiceServicer,
        _SERVICE.full_name,
        [m.name for m in _SERVICE.methods],
        "issue #4",
    )
    registration = ServiceRegistration(
        _SERVICE.full_name,
        lambda server: gateway_service_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server),
    )
    return await start_grpc_server(
        [registration],
        host=settings.host,
        port=settings.port,
        tracer_provider=tracer_provider,
        auth_token=settings.auth_token,
    )


def main() -> None:
    """Run the GatewayService until SIGTERM."""
    settings = GatewaySettings.load()
    provider = create_tracer_provider("gateway")
    asyncio.run(run_until_signal(lambda: create_server(settings, tracer_provider=provider), name="gateway"))
