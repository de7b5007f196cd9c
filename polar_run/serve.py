"""``polar serve``: the five services by name, loaded lazily, started in one process and wired to each other.

Services are imported when they start, so ``polar serve proxy`` imports only the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import secrets
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider

from polar_core.errors import InvalidArgument
from polar_core.settings import ServiceSettings
from polar_core.tracing import create_tracer_provider

__all__ = ["SERVE_PROXY_ID", "SERVICE_NAMES", "ServeOptions", "ServiceSpec", "serve", "service_spec"]

SERVICE_NAMES = ("rollout", "gateway", "proxy", "reconstructor", "evaluator")

_MODULES = {
    "rollout": ("rollout_server", "RolloutSettings", "polar.rollout.v1.RolloutService"),
    "gateway": ("gateway", "GatewaySettings", "polar.gateway.v1.GatewayService"),
    "proxy": ("model_proxy", "ProxySettings", "polar.proxy.v1.ModelProxyService"),
    "reconstructor": ("reconstructor", "ReconstructorSettings", "polar.reconstructor.v1.ReconstructorService"),
    "evaluator": ("evaluator", "EvaluatorSettings", "polar.evaluator.v1.EvaluatorService"),
}

# Start order for several services in one process: each is wired to the services started before it. The
# rollout server comes first so the proxy joins its fleet at start (RegisterProxy, as a standalone proxy with
# rollout_address does), and the gateway last, wired to all four.
_START_ORDER = ("rollout", "proxy", "reconstructor", "evaluator", "gateway")
SERVE_PROXY_ID = "serve-proxy"
"""The id ``polar serve``'s proxy registers under with the rollout server of the same process (unless the
proxy's settings name one): stable across restarts, so a restart on the same state directory replaces its record
instead of leaving an unreachable one behind."""

CreateServer = Callable[..., Awaitable[tuple[grpc.aio.Server, int]]]


@dataclasses.dataclass(frozen=True, slots=True)
class ServiceSpec:
    """How to configure and start one service."""

    name: str
    grpc_service: str
    settings_cls: type[ServiceSettings]
    create_server: CreateServer

    async def start(
        self, settings: ServiceSettings, tracer_provider: TracerProvider | None = None
    ) -> tuple[grpc.aio.Server, int]:
        """Start the service with ``settings``."""
        return await self.create_server(settings, tracer_provider=tracer_provider)


def service_spec(name: str) -> ServiceSpec:
    """Return the spec of service ``name`` (one of :data:`SERVICE_NAMES`)."""
    try:
        package, settings_name, grpc_service = _MODULES[name]
    except KeyError:
        raise InvalidArgument(f"unknown service {name!r}; choose from {', '.join(SERVICE_NAMES)}") from None
    settings_mod: Any = importlib.import_module(f"{package}.settings")
    server_mod: Any = importlib.import_module(f"{package}.server")
    return ServiceSpec(name, grpc_service, getattr(settings_mod, settings_name), server_mod.create_server)


@dataclasses.dataclass(frozen=True, slots=True)
class ServeOptions:
    """What ``polar serve`` was asked for.

    Attributes:
        services: Services to run in this process (empty: all five).
        config: TOML settings file, if any.
        state_dir: Directory for durable state; several services each get a folder under it.
        host: Interface to bind (``None``: each service's setting).
        port: Port of a single service (``None``: its setting; ignored for several).
        check: Start, check every service's health, and return instead of serving.
        insecure: Let a service listen on a non-loopback address with neither a token nor mTLS (``--insecure``;
            each service's ``insecure`` setting).
    """

    services: Sequence[str] = ()
    config: Path | None = None
    state_dir: Path | None = None
    host: str | None = None
    port: int | None = None
    check: bool = False
    insecure: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class _Started:
    name: str
    server: grpc.aio.Server
    host: str
    port: int
    grpc_service: str
    shared_token: bool = False
    dashboard_url: str = ""
    metrics: str = ""
    """``host:port`` of the service's Prometheus endpoint; empty when off."""


async def serve(options: ServeOptions) -> int:
    """Start the requested services, print their addresses, and serve until SIGTERM/SIGINT (or check health).

    Returns:
        The exit status: 0, or 1 when ``check`` found an unhealthy service.
    """
    requested = list(dict.fromkeys(options.services)) or list(SERVICE_NAMES)
    for name in requested:
        service_spec(name)  # unknown names fail before anything starts
    names = sorted(requested, key=_START_ORDER.index)
    # Services sharing a process share a control-plane token; the embedded default makes its own.
    token = secrets.token_urlsafe(24) if len(names) > 1 else ""
    addresses: dict[str, str] = {}
    started: list[_Started] = []
    try:
        for name in names:
            service = await _start_one(name, options, several=len(names) > 1, addresses=addresses, token=token)
            started.append(service)
            local = "127.0.0.1" if service.host in ("0.0.0.0", "::") else service.host
            addresses[name] = f"{local}:{service.port}"
            print(f"{name:<14} {service.host}:{service.port}  ({service.grpc_service})", flush=True)
            if service.dashboard_url:
                print(
                    f"{'dashboard':<14} {service.dashboard_url}  (log in with the trainer or admin token)", flush=True
                )
            if service.metrics:
                print(f"{name:<14} metrics http://{service.metrics}/metrics", flush=True)
        if any(service.shared_token for service in started):
            print(f"control-plane token: {token}", flush=True)
        if options.check:
            return await _check_all(started)
        if await _wait_for_signal() == signal.SIGUSR1:
            await _drain_for_exit(started)
        return 0
    finally:
        await asyncio.gather(*(service.server.stop(5) for service in started))


async def _start_one(
    name: str, options: ServeOptions, *, several: bool, addresses: dict[str, str], token: str
) -> _Started:
    spec = service_spec(name)
    overrides: dict[str, object] = {"host": options.host, "insecure": True if options.insecure else None}
    if options.state_dir is not None:
        # Several services in one process each get their own folder under the given one.
        overrides["state_dir"] = options.state_dir / name if several else options.state_dir
    if options.port is not None and not several:
        overrides["port"] = options.port
    settings = spec.settings_cls.load(options.config, **overrides)
    wiring = _wiring(name, settings, addresses, token)
    if wiring:
        settings = spec.settings_cls.load(options.config, **overrides, **wiring)
    settings.check_listen_security()  # before anything starts
    server, port = await spec.start(settings, create_tracer_provider(name))
    return _Started(
        name,
        server,
        settings.host,
        port,
        spec.grpc_service,
        "auth_token" in wiring,
        _dashboard_url(server),
        _metrics(server, settings),
    )


def _dashboard_url(server: grpc.aio.Server) -> str:
    """The rollout server's dashboard address when its settings turned one on (``dashboard_address``)."""
    app = getattr(getattr(server, "running", None), "app", None)
    board = getattr(app, "dashboard", None)
    return str(board.url) if board is not None else ""


def _metrics(server: grpc.aio.Server, settings: ServiceSettings) -> str:
    """``host:port`` of a started service's Prometheus endpoint (its ``metrics_*`` settings), or "" when off."""
    app = getattr(getattr(server, "running", None), "app", None)
    port = getattr(app, "metrics_port", -1)
    if not isinstance(port, int) or port < 0:
        return ""
    host = "127.0.0.1" if settings.metrics_host in ("0.0.0.0", "::", "") else settings.metrics_host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _wiring(name: str, settings: ServiceSettings, addresses: dict[str, str], token: str) -> dict[str, object]:
    """Settings that connect ``name`` to the services already started in this process (unset ones only)."""
    wiring: dict[str, object] = {}
    if token and not settings.accepted_tokens():
        # Only a service configured with no token at all gets the process's shared (all-roles) one: role
        # tokens set by the operator are never widened by an injected token.
        wiring["auth_token"] = token
    if name == "proxy" and "rollout" in addresses and not getattr(settings, "rollout_address", "x"):
        # Join the fleet of the rollout server in this process: GetPolicy lists this proxy, UpdatePolicy moves
        # it, and on a state directory with a stored policy it loads that policy before its first call.
        wiring["rollout_address"] = addresses["rollout"]
        if not getattr(settings, "proxy_id", "x"):
            wiring["proxy_id"] = SERVE_PROXY_ID
    if name == "gateway":
        for peer in ("proxy", "reconstructor", "evaluator", "rollout"):
            if peer in addresses and not getattr(settings, f"{peer}_address", "x"):
                wiring[f"{peer}_address"] = addresses[peer]
        if all(f"{peer}_address" in wiring for peer in ("proxy", "reconstructor", "evaluator")):
            # They share this process: none can be unreachable while the gateway runs, and a loop busy with
            # an in-process model must not look like an outage.
            wiring["dependency_probes"] = False
    return wiring


async def _check_all(started: Sequence[_Started]) -> int:
    ok = True
    for service in started:
        healthy = await _check_health(service.host, service.port, service.grpc_service)
        ok &= healthy
        print(f"health {service.name:<14} {'SERVING' if healthy else 'NOT SERVING'}", flush=True)
    print("all services healthy" if ok else "some services are unhealthy", flush=True)
    return 0 if ok else 1


async def _check_health(host: str, port: int, service: str) -> bool:
    target = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    async with grpc.aio.insecure_channel(f"{target}:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def _wait_for_signal() -> signal.Signals:
    """Wait for SIGTERM or SIGINT (stop now) or SIGUSR1 (drain, then stop); return which came."""
    stop = asyncio.Event()
    received: list[signal.Signals] = []
    loop = asyncio.get_running_loop()

    def _received(sig: signal.Signals) -> None:
        received.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, _received, sig)
    await stop.wait()
    return received[0]


async def _drain_for_exit(started: Sequence[_Started]) -> None:
    """SIGUSR1 (a Slurm job's ``--signal`` before its time limit): services that can drain (the gateway: no new
    session, running ones finish within its ``drain_timeout_s``) do so before everything stops; a second
    SIGTERM or SIGINT cuts the wait short."""
    drains = []
    for service in started:
        app = getattr(getattr(service.server, "running", None), "app", None)
        drain = getattr(app, "drain_for_exit", None)
        if drain is not None:
            drains.append(asyncio.ensure_future(drain()))
    if not drains:
        return
    waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(_wait_for_signal()), asyncio.gather(*drains)]
    interrupted = waits[0]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    interrupted.cancel()
    for drain_task in drains:
        drain_task.cancel()
