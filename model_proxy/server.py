"""gRPC server of the ModelProxyService, with the provider HTTP API on its own port."""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry.sdk.trace import TracerProvider

from model_proxy.app import ProxyApp
from model_proxy.policy import load_policy, make_backend
from model_proxy.servicer import registration
from model_proxy.settings import ProxySettings
from polar_core.server import ManagedServer, run_until_signal, start_service_server
from polar_core.tracing import create_tracer_provider

__all__ = ["create_server", "main"]


async def create_server(
    settings: ProxySettings, *, tracer_provider: TracerProvider | None = None
) -> tuple[grpc.aio.Server, int]:
    """Load the policy, start the backend and the HTTP API, then the gRPC server; return it and its port.

    Stopping the returned server also stops the HTTP API and closes the backend.
    """
    policy = await asyncio.to_thread(load_policy, settings.model, with_weights=settings.backend == "transformers")
    backend = make_backend(settings.backend, settings.backend_options, policy)
    app = ProxyApp(settings, backend, policy.tokenizer, tracer_provider=tracer_provider)
    await app.start()
    try:
        server, port = await start_service_server([registration(app)], settings, tracer_provider=tracer_provider)
    except BaseException:
        await app.stop()
        raise
    return ManagedServer(server, app.stop).as_server(), port


def main() -> None:
    """Run the model proxy until SIGTERM."""
    settings = ProxySettings.load()
    provider = create_tracer_provider("proxy")
    asyncio.run(run_until_signal(lambda: create_server(settings, tracer_provider=provider), name="proxy"))
