"""gRPC server of the ReconstructorService: wiring only (the app builds what the servicer needs)."""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.reconstructor.v1 import reconstructor_service_pb2, reconstructor_service_pb2_grpc

from polar_core.server import RunningService, ServiceRegistration, run_until_signal, serve_app
from polar_core.tracing import create_tracer_provider
from reconstructor.app import ReconstructorApp
from reconstructor.ports import CompletionSource
from reconstructor.servicer import ReconstructorServicer
from reconstructor.settings import ReconstructorSettings

__all__ = ["create_server", "main", "start_server"]

_SERVICE = reconstructor_service_pb2.DESCRIPTOR.services_by_name["ReconstructorService"]


async def start_server(
    settings: ReconstructorSettings,
    *,
    tracer_provider: TracerProvider | None = None,
    completion_source: CompletionSource | None = None,
) -> RunningService[ReconstructorApp]:
    """Start the ReconstructorService on ``settings.host:settings.port`` (0 picks a port)."""
    app = await ReconstructorApp.open(settings, tracer_provider=tracer_provider, completion_source=completion_source)
    servicer = ReconstructorServicer(
        app.defaults, app.completion_source, max_message_bytes=settings.max_message_bytes, metrics=app.metrics
    )
    registration = ServiceRegistration(
        _SERVICE.full_name,
        lambda server: reconstructor_service_pb2_grpc.add_ReconstructorServiceServicer_to_server(servicer, server),
    )
    return await serve_app(app, [registration], settings, tracer_provider=tracer_provider)


async def create_server(
    settings: ReconstructorSettings, *, tracer_provider: TracerProvider | None = None
) -> tuple[grpc.aio.Server, int]:
    """:func:`start_server` as a plain ``grpc.aio.Server`` and its port."""
    running = await start_server(settings, tracer_provider=tracer_provider)
    return running.as_grpc_server(), running.port


def main() -> None:
    """Run the ReconstructorService until SIGTERM."""
    settings = ReconstructorSettings.load()
    provider = create_tracer_provider("reconstructor")
    asyncio.run(run_until_signal(lambda: create_server(settings, tracer_provider=provider), name="reconstructor"))
