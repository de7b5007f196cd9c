"""gRPC server of the ReconstructorService."""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.reconstructor.v1 import reconstructor_service_pb2, reconstructor_service_pb2_grpc

from polar_core.server import ServiceRegistration, run_until_signal, start_service_server
from polar_core.tracing import create_tracer_provider
from reconstructor.servicer import ReconstructorServicer
from reconstructor.settings import ReconstructorSettings

__all__ = ["create_server", "main"]

_SERVICE = reconstructor_service_pb2.DESCRIPTOR.services_by_name["ReconstructorService"]


async def create_server(
    settings: ReconstructorSettings, *, tracer_provider: TracerProvider | None = None
) -> tuple[grpc.aio.Server, int]:
    """Start the ReconstructorService on ``settings.host:settings.port`` (0 picks a port) and return it."""
    servicer = ReconstructorServicer.from_settings(settings, tracer_provider=tracer_provider)
    registration = ServiceRegistration(
        _SERVICE.full_name,
        lambda server: reconstructor_service_pb2_grpc.add_ReconstructorServiceServicer_to_server(servicer, server),
    )
    return await start_service_server([registration], settings, tracer_provider=tracer_provider)


def main() -> None:
    """Run the ReconstructorService until SIGTERM."""
    settings = ReconstructorSettings.load()
    provider = create_tracer_provider("reconstructor")
    asyncio.run(run_until_signal(lambda: create_server(settings, tracer_provider=provider), name="reconstructor"))
