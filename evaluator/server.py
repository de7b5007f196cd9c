"""gRPC server of the EvaluatorService."""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.evaluator.v1 import evaluator_service_pb2, evaluator_service_pb2_grpc

from evaluator.service import EvaluatorService
from evaluator.servicer import EvaluatorServicer
from evaluator.settings import EvaluatorSettings
from polar_core.server import ManagedServer, ServiceRegistration, run_until_signal, start_service_server
from polar_core.tracing import create_tracer_provider

__all__ = ["create_server", "main"]

_SERVICE = evaluator_service_pb2.DESCRIPTOR.services_by_name["EvaluatorService"]


async def create_server(
    settings: EvaluatorSettings, *, tracer_provider: TracerProvider | None = None
) -> tuple[grpc.aio.Server, int]:
    """Start the EvaluatorService on ``settings.host:settings.port`` (0 picks a port) and return it.

    Stopping the returned server also releases every runtime the evaluator still holds.
    """
    service = EvaluatorService(settings)
    servicer = EvaluatorServicer(service)
    registration = ServiceRegistration(
        _SERVICE.full_name,
        lambda server: evaluator_service_pb2_grpc.add_EvaluatorServiceServicer_to_server(servicer, server),
    )
    server, port = await start_service_server([registration], settings, tracer_provider=tracer_provider)
    return ManagedServer(server, service.close).as_server(), port


def main() -> None:
    """Run the EvaluatorService until SIGTERM."""
    settings = EvaluatorSettings.load()
    provider = create_tracer_provider("evaluator")
    asyncio.run(run_until_signal(lambda: create_server(settings, tracer_provider=provider), name="evaluator"))
