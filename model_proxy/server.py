"""gRPC server of the ModelProxyService, with the provider HTTP API on its own port."""

from __future__ import annotations

import asyncio
import socket

import grpc
from opentelemetry.sdk.trace import TracerProvider

from model_proxy.app import ProxyApp
from model_proxy.fleet import FleetMembership
from model_proxy.policy import load_policy, make_backend
from model_proxy.rollout_client import GrpcRolloutRegistrar
from model_proxy.servicer import registration
from model_proxy.settings import ProxySettings
from polar_core.server import ManagedServer, run_until_signal, start_service_server
from polar_core.tracing import create_tracer_provider

__all__ = ["create_server", "join_fleet", "main"]


async def create_server(
    settings: ProxySettings, *, tracer_provider: TracerProvider | None = None
) -> tuple[grpc.aio.Server, int]:
    """Load the policy, start the backend and the HTTP API, then the gRPC server; return it and its port.

    Stopping the returned server also stops the HTTP API and closes the backend.
    """
    policy = await asyncio.to_thread(load_policy, settings.model, with_weights=settings.backend == "transformers")
    backend = make_backend(settings.backend, settings.backend_options, policy)
    app = ProxyApp(settings, backend, policy.tokenizer, tracer_provider=tracer_provider)
    if settings.rollout_address:
        # Hold every call until the fleet's policy is served (see model_proxy.fleet).
        await app.engine.gate.pause(abort_in_flight=False, drain_timeout_s=1.0)
    await app.start()
    try:
        server, port = await start_service_server([registration(app)], settings, tracer_provider=tracer_provider)
    except BaseException:
        await app.stop()
        raise
    if settings.rollout_address:
        app.membership = join_fleet(app, settings, port, tracer_provider=tracer_provider)
    return ManagedServer(server, app.stop).as_server(), port


def join_fleet(
    app: ProxyApp, settings: ProxySettings, port: int, *, tracer_provider: TracerProvider | None = None
) -> FleetMembership:
    """Start registering with ``settings.rollout_address`` (the app's gate must be paused)."""
    address = settings.advertise_address or _advertised(settings.host, port)
    registrar = GrpcRolloutRegistrar(
        settings.rollout_address, auth_token=settings.auth_token, tracer_provider=tracer_provider, tls=settings.tls()
    )
    membership = FleetMembership(
        app.weights,
        app.engine.gate,
        registrar,
        proxy_id=settings.proxy_id or f"proxy-{address}",
        address=address,
        backend=settings.backend,
    )
    membership.start()
    return membership


def _advertised(host: str, port: int) -> str:
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.gethostname()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def main() -> None:
    """Run the model proxy until SIGTERM."""
    settings = ProxySettings.load()
    provider = create_tracer_provider("proxy")
    asyncio.run(run_until_signal(lambda: create_server(settings, tracer_provider=provider), name="proxy"))
