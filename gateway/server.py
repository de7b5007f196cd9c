"""gRPC server of the GatewayService: serves a :class:`gateway.app.GatewayApp` (wiring only)."""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.gateway.v1 import gateway_service_pb2, gateway_service_pb2_grpc

from gateway.app import GatewayApp, GatewaySeams
from gateway.servicer import GatewayServicer
from gateway.settings import GatewaySettings
from polar_core.server import RunningService, ServiceRegistration, run_until_signal, serve_app
from polar_core.tracing import create_tracer_provider

__all__ = ["GatewaySeams", "create_server", "main", "start_server"]

_SERVICE = gateway_service_pb2.DESCRIPTOR.services_by_name["GatewayService"]


async def start_server(
    settings: GatewaySettings,
    *,
    tracer_provider: TracerProvider | None = None,
    seams: GatewaySeams | None = None,
) -> RunningService[GatewayApp]:
    """Start the GatewayService on ``settings.host:settings.port`` (0 picks a port).

    The Prometheus endpoint starts on ``settings.metrics_port`` (0 picks one; read it from
    ``running.app.metrics_port``). Stopping the service cancels running sessions (they tear down within the
    grace) and closes the clients.
    """
    app = await GatewayApp.open(settings, tracer_provider=tracer_provider, seams=seams)
    servicer = GatewayServicer(app.pipeline)
    registration = ServiceRegistration(
        _SERVICE.full_name,
        lambda server: gateway_service_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server),
    )
    running = await serve_app(app, [registration], settings, tracer_provider=tracer_provider, drain=app.shut_down)
    app.serving(running.port)
    return running


async def create_server(
    settings: GatewaySettings,
    *,
    tracer_provider: TracerProvider | None = None,
    seams: GatewaySeams | None = None,
) -> tuple[grpc.aio.Server, int]:
    """:func:`start_server` as a ``grpc.aio.Server`` (whose ``stop`` also closes the app) and its port."""
    running = await start_server(settings, tracer_provider=tracer_provider, seams=seams)
    return running.as_grpc_server(), running.port


def main() -> None:
    """Run the GatewayService until SIGTERM."""
    settings = GatewaySettings.load()
    provider = create_tracer_provider("gateway")
    asyncio.run(run_until_signal(lambda: create_server(settings, tracer_provider=provider), name="gateway"))
