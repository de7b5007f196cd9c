"""gRPC server of the EvaluatorService: wiring only (the app builds the service, the servicer serves it)."""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.evaluator.v1 import evaluator_service_pb2, evaluator_service_pb2_grpc

from evaluator.app import EvaluatorApp
from evaluator.ports import RuntimeFactory
from evaluator.servicer import EvaluatorServicer
from evaluator.settings import EvaluatorSettings
from polar_core.server import RunningService, ServiceRegistration, run_until_signal, serve_app
from polar_core.tracing import create_tracer_provider

__all__ = ["create_server", "main", "start_server"]

_SERVICE = evaluator_service_pb2.DESCRIPTOR.services_by_name["EvaluatorService"]


async def start_server(
    settings: EvaluatorSettings,
    *,
    tracer_provider: TracerProvider | None = None,
    runtime_factory: RuntimeFactory | None = None,
) -> RunningService[EvaluatorApp]:
    """Start the EvaluatorService on ``settings.host:settings.port`` (0 picks a port).

    Stopping the returned service also releases every runtime the evaluator still holds.
    """
    app = await EvaluatorApp.open(settings, tracer_provider=tracer_provider, runtime_factory=runtime_factory)
    servicer = EvaluatorServicer(app.service)
    registration = ServiceRegistration(
        _SERVICE.full_name,
        lambda server: evaluator_service_pb2_grpc.add_EvaluatorServiceServicer_to_server(servicer, server),
    )
    return await serve_app(app, [registration], settings, tracer_provider=tracer_provider)


async def create_server(
    settings: EvaluatorSettings, *, tracer_provider: TracerProvider | None = None
) -> tuple[grpc.aio.Server, int]:
    """:func:`start_server` as a ``grpc.aio.Server`` whose ``stop`` also releases the evaluator's runtimes."""
    running = await start_server(settings, tracer_provider=tracer_provider)
    return running.as_grpc_server(), running.port


def main() -> None:
    """Run the EvaluatorService until SIGTERM."""
    settings = EvaluatorSettings.load()
    provider = create_tracer_provider("evaluator")
    asyncio.run(run_until_signal(lambda: create_server(settings, tracer_provider=provider), name="evaluator"))
