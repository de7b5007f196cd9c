"""gRPC server plumbing shared by every service: health, reflection, tracing, error mapping, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.instrumentation.grpc import aio_server_interceptor
from opentelemetry.sdk.trace import TracerProvider

from polar_core.auth import RoleAuthInterceptor
from polar_core.gateway_tokens import GatewayTokenVerifier
from polar_core.grpc_errors import ErrorMappingInterceptor
from polar_core.limits import DEFAULT_MAX_MESSAGE_BYTES, message_options
from polar_core.roles import ALL_ROLES, Role
from polar_core.settings import ServiceSettings
from polar_core.tls import TlsFiles, server_credentials

__all__ = [
    "RunningService",
    "ServiceApp",
    "ServiceRegistration",
    "run_until_signal",
    "serve_app",
    "start_grpc_server",
    "start_service_server",
]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class ServiceRegistration:
    """A servicer to add to a server.

    Attributes:
        name: Full service name (``polar.proxy.v1.ModelProxyService``) for health and reflection.
        add: Adds the servicer to a server (the generated ``add_..._to_server`` bound to a servicer).
    """

    name: str
    add: Callable[[grpc.aio.Server], None]


async def start_grpc_server(
    registrations: Sequence[ServiceRegistration],
    *,
    host: str,
    port: int,
    tracer_provider: TracerProvider | None = None,
    auth_token: str = "",
    tls: TlsFiles | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    tokens: Mapping[str, frozenset[Role]] | None = None,
    gateway_tokens: GatewayTokenVerifier | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Start a gRPC server with health checking, reflection, OpenTelemetry and error mapping.

    Args:
        registrations: The servicers to serve; each is marked SERVING in the health service.
        host: Interface to bind.
        port: Port to bind; 0 picks a free one, which is returned.
        tracer_provider: Provider for server spans; ``None`` uses the global (no-op unless configured).
        auth_token: When set, every call but health checks and reflection must carry it (it grants every role).
        tls: When set, serve mutual TLS: clients must present a certificate signed by ``tls.ca_file``, whose
            ``polar:`` names narrow the caller's roles (:mod:`polar_core.auth`).
        tokens: Accepted tokens and the roles each grants, on top of ``auth_token``; the method tables of
            :mod:`polar_core.roles` say which roles may call what.
        max_message_bytes: The largest message the server receives or sends.
        gateway_tokens: Verifies per-gateway tokens (:mod:`polar_core.gateway_tokens`; the rollout server's).

    Returns:
        The started server and the bound port.
    """
    interceptors: list[Any] = [aio_server_interceptor(tracer_provider=tracer_provider)]  # type: ignore[no-untyped-call]
    accepted = dict(tokens or {})
    if auth_token:
        accepted[auth_token] = ALL_ROLES
    if accepted or tls is not None or gateway_tokens is not None:
        interceptors.append(RoleAuthInterceptor(accepted, mtls=tls is not None, gateway_tokens=gateway_tokens))
    interceptors.append(ErrorMappingInterceptor())
    server = grpc.aio.server(interceptors=interceptors, options=message_options(max_message_bytes))
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [r.name for r in registrations]
    for registration in registrations:
        registration.add(server)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    address = f"{host}:{port}"
    bound = server.add_secure_port(address, server_credentials(tls)) if tls else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot bind gRPC server to {host}:{port}")
    await server.start()
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, bound


async def run_until_signal(
    start: Callable[[], Awaitable[tuple[grpc.aio.Server, int]]],
    *,
    name: str,
    grace_s: float = 10.0,
    on_stop: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Start a server, log its address, and stop it gracefully on SIGTERM or SIGINT."""
    server, port = await start()
    _log.info("%s listening on port %d", name, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    waiter = asyncio.create_task(server.wait_for_termination())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    _log.info("%s stopping (grace %.0f s)", name, grace_s)
    await server.stop(grace_s)
    if on_stop is not None:
        await on_stop()
    for task in (waiter, stopper):
        task.cancel()


class ServiceApp(Protocol):
    """What a service's ``app.py`` builds from its settings: the domain object and everything it owns."""

    async def close(self) -> None:
        """Release what the app owns (stores, clients, runtimes, HTTP fronts, background loops)."""


AppT = TypeVar("AppT", bound=ServiceApp)


@dataclasses.dataclass
class RunningService(Generic[AppT]):
    """A started service: its gRPC server, the port it bound and the app behind it.

    Every service's ``server.start_server(settings)`` returns one; ``create_server`` hands out
    :meth:`as_grpc_server` for callers (``polar serve``, tests) that stop everything with one
    ``await server.stop(grace)``.
    """

    server: grpc.aio.Server
    port: int
    app: AppT
    drain: Callable[[float], Awaitable[None]] | None = None
    """Called with the grace before serving stops, while the server still answers (the gateway tears its
    running sessions down there, so watchers see them end)."""
    _stopped: bool = dataclasses.field(default=False, init=False, repr=False)

    async def stop(self, grace: float | None = None) -> None:
        """Drain (if set), stop serving (letting calls finish within ``grace``), then close the app; idempotent."""
        if self.drain is not None and not self._stopped:
            await self.drain(grace if grace is not None else 0.0)
        await self.server.stop(grace)
        if not self._stopped:
            self._stopped = True
            await self.app.close()

    def as_grpc_server(self) -> grpc.aio.Server:
        """This service as a ``grpc.aio.Server`` whose ``stop`` also closes the app."""
        return _OwningServer(self)


class _OwningServer(grpc.aio.Server):
    """A ``grpc.aio.Server`` that delegates to a :class:`RunningService`; ``stop`` closes the app too."""

    def __init__(self, running: RunningService[Any]) -> None:
        self.running = running

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Iterable[grpc.GenericRpcHandler[Any, Any]]) -> None:
        self.running.server.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_insecure_port(self, address: str) -> int:
        return self.running.server.add_insecure_port(address)

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        return self.running.server.add_secure_port(address, server_credentials)

    async def start(self) -> None:
        await self.running.server.start()

    async def stop(self, grace: float | None = None) -> None:
        await self.running.stop(grace)

    async def wait_for_termination(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 (grpc's API)
        return await self.running.server.wait_for_termination(timeout)


async def start_service_server(
    registrations: Sequence[ServiceRegistration],
    settings: ServiceSettings,
    *,
    tracer_provider: TracerProvider | None = None,
    gateway_tokens: GatewayTokenVerifier | None = None,
) -> tuple[grpc.aio.Server, int]:
    """:func:`start_grpc_server` with the address, tokens, mTLS files and message limit of a service's settings.

    ``gateway_tokens`` verifies per-gateway tokens (the rollout server's, from its own settings).

    Raises:
        InvalidArgument: The settings bind a non-loopback address with neither a token nor mTLS, and do not
            say ``insecure`` (:meth:`ServiceSettings.check_listen_security`).
    """
    settings.check_listen_security()
    return await start_grpc_server(
        registrations,
        host=settings.host,
        port=settings.port,
        tracer_provider=tracer_provider,
        tls=settings.tls(),
        max_message_bytes=settings.max_message_bytes,
        tokens=settings.accepted_tokens(),
        gateway_tokens=gateway_tokens,
    )


async def serve_app(
    app: AppT,
    registrations: Sequence[ServiceRegistration],
    settings: ServiceSettings,
    *,
    tracer_provider: TracerProvider | None = None,
    drain: Callable[[float], Awaitable[None]] | None = None,
    gateway_tokens: GatewayTokenVerifier | None = None,
) -> RunningService[AppT]:
    """Serve an opened app over gRPC (:func:`start_service_server`); the app is closed if serving fails."""
    try:
        server, port = await start_service_server(
            registrations, settings, tracer_provider=tracer_provider, gateway_tokens=gateway_tokens
        )
    except BaseException:
        await app.close()
        raise
    return RunningService(server, port, app, drain=drain)
