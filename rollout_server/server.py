"""gRPC server of the RolloutService: wiring only (the app is built in :mod:`rollout_server.app`)."""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.rollout.v1 import rollout_service_pb2, rollout_service_pb2_grpc

from polar_core.server import RunningService, ServiceRegistration, run_until_signal, serve_app
from polar_core.tracing import create_tracer_provider
from rollout_server.app import RolloutApp
from rollout_server.ports import CallbackSender, CurrentPolicyVersion, GatewayClient, ProxyClient
from rollout_server.servicer import RolloutServicer
from rollout_server.settings import RolloutSettings
from rollout_server.store import Store

__all__ = ["create_server", "main", "start_server"]

_SERVICE = rollout_service_pb2.DESCRIPTOR.services_by_name["RolloutService"]


async def start_server(
    settings: RolloutSettings,
    *,
    tracer_provider: TracerProvider | None = None,
    store: Store | None = None,
    gateway_client: GatewayClient | None = None,
    callback_sender: CallbackSender | None = None,
    proxy_client: ProxyClient | None = None,
    current_policy: CurrentPolicyVersion | None = None,
) -> RunningService[RolloutApp]:
    """Open the app, serve it on ``settings.host:settings.port`` (0 picks a port), then start it.

    ``store``, ``gateway_client``, ``callback_sender`` and ``proxy_client`` replace the ones the settings name
    (tests, benchmarks); ``current_policy`` replaces the source of the fleet's policy version (see
    ``RolloutApp.open``).
    Starting reconciles with the gateways and the store and starts the dispatch, watchdog and delivery loops;
    ``stop`` on the result stops serving, then the loops, and closes the store.
    """
    verifier = settings.gateway_token_verifier()  # a bad key file fails before anything is opened
    app = await RolloutApp.open(
        settings,
        tracer_provider=tracer_provider,
        store=store,
        gateway_client=gateway_client,
        callback_sender=callback_sender,
        proxy_client=proxy_client,
        current_policy=current_policy,
    )
    servicer = RolloutServicer(app.core, app.policy)
    registration = ServiceRegistration(
        _SERVICE.full_name,
        lambda server: rollout_service_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, server),
    )
    running = await serve_app(app, [registration], settings, tracer_provider=tracer_provider, gateway_tokens=verifier)
    await app.start()
    return running


async def create_server(
    settings: RolloutSettings, *, tracer_provider: TracerProvider | None = None
) -> tuple[grpc.aio.Server, int]:
    """Start the RolloutService on ``settings.host:settings.port`` (0 picks a port) and return it.

    Stopping the returned server also stops the app's loops and closes the store.
    """
    running = await start_server(settings, tracer_provider=tracer_provider)
    return running.as_grpc_server(), running.port


def main() -> None:
    """Run the RolloutService until SIGTERM."""
    settings = RolloutSettings.load()
    provider = create_tracer_provider("rollout")
    asyncio.run(run_until_signal(lambda: create_server(settings, tracer_provider=provider), name="rollout"))
