"""gRPC server of the ModelProxyService, with the provider HTTP API on its own port (wiring only)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from opentelemetry.sdk.trace import TracerProvider

from model_proxy.app import ProxyApp
from model_proxy.ports import Backend
from model_proxy.servicer import registration
from model_proxy.settings import ProxySettings
from polar_core.server import RunningService, run_until_signal, serve_app
from polar_core.tracing import create_tracer_provider

__all__ = ["create_server", "main", "start_server"]


async def start_server(
    settings: ProxySettings,
    *,
    tracer_provider: TracerProvider | None = None,
    backend: Backend | None = None,
    tokenizer: Any | None = None,
) -> RunningService[ProxyApp]:
    """Open the :class:`ProxyApp` (policy, backend, HTTP API), then serve it over gRPC.

    With ``settings.rollout_address`` set, the proxy joins that rollout server's fleet once its gRPC port is
    known (:meth:`ProxyApp.serving`); its calls are held until it serves the fleet's policy.

    Args:
        settings: Proxy settings.
        tracer_provider: Provider for spans; None uses the global one.
        backend: A backend to use instead of the one the settings name (tests).
        tokenizer: The policy's tokenizer, when the caller has it loaded already.

    Returns:
        The running service; stopping it also leaves the fleet, stops the HTTP API and closes the backend.
    """
    app = await ProxyApp.open(settings, tracer_provider=tracer_provider, backend=backend, tokenizer=tokenizer)
    running = await serve_app(app, [registration(app)], settings, tracer_provider=tracer_provider)
    app.serving(running.port)
    return running


async def create_server(
    settings: ProxySettings, *, tracer_provider: TracerProvider | None = None
) -> tuple[grpc.aio.Server, int]:
    """Start the proxy (:func:`start_server`); return its gRPC server, whose ``stop`` closes the app, and port."""
    running = await start_server(settings, tracer_provider=tracer_provider)
    return running.as_grpc_server(), running.port


def main() -> None:
    """Run the model proxy until SIGTERM."""
    settings = ProxySettings.load()
    provider = create_tracer_provider("proxy")
    asyncio.run(run_until_signal(lambda: create_server(settings, tracer_provider=provider), name="proxy"))
