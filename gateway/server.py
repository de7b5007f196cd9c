"""gRPC server of the GatewayService: wires settings to the pipeline, its seams and the metrics endpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import Any

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.gateway.v1 import gateway_service_pb2, gateway_service_pb2_grpc

from gateway.agent import HarnessAgentRunner, SpecRuntimeFactory
from gateway.clients import (
    GrpcEvaluatorClient,
    GrpcProxyClient,
    GrpcReconstructorClient,
    GrpcResultSink,
    GrpcRolloutRegistrar,
)
from gateway.core import SessionPipeline
from gateway.metrics import GatewayMetrics, MetricsEndpoint
from gateway.models import ProxyEndpoints, SessionSpec
from gateway.ports import AgentRunner, EvaluatorClient, ProxyClient, ReconstructorClient, ResultSink, RuntimeFactory
from gateway.registration import RegistrationLoop
from gateway.servicer import GatewayServicer
from gateway.settings import GatewaySettings
from gateway.tunnel import ProxyTunnel
from polar_core.errors import FailedPrecondition
from polar_core.records import CompletionRecord
from polar_core.server import ServiceRegistration, run_until_signal, start_service_server
from polar_core.tracing import create_tracer_provider
from runtimes import DefaultRuntimeFactory

__all__ = ["GatewaySeams", "create_server", "main"]

_log = logging.getLogger(__name__)
_SERVICE = gateway_service_pb2.DESCRIPTOR.services_by_name["GatewayService"]


@dataclasses.dataclass
class GatewaySeams:
    """Seams to use instead of the ones built from settings (embedded wiring and tests); ``None`` builds it."""

    runtimes: RuntimeFactory | None = None
    agents: AgentRunner | None = None
    proxy: ProxyClient | None = None
    reconstructor: ReconstructorClient | None = None
    evaluator: EvaluatorClient | None = None
    sink: ResultSink | None = None


class _NoProxy:
    """Stands in when no proxy address is configured: every session fails at INIT, visibly."""

    async def open_session(self, spec: SessionSpec, model: str, *, timeout_s: float) -> ProxyEndpoints:
        raise FailedPrecondition("the gateway has no model proxy configured (set POLAR_GATEWAY_PROXY_ADDRESS)")

    async def close_session(self, session_id: str, *, timeout_s: float) -> int:
        return 0

    async def list_completions(self, session_id: str, *, timeout_s: float) -> list[CompletionRecord]:
        return []


class _GatewayServer(grpc.aio.Server):
    """The gRPC server, whose ``stop`` also drains the pipeline and closes clients and the metrics endpoint."""

    def __init__(self, inner: grpc.aio.Server, cleanup: Callable[[float | None], Awaitable[None]]) -> None:
        self._inner = inner
        self._cleanup = cleanup
        self._stopped = False

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Iterable[grpc.GenericRpcHandler[Any, Any]]) -> None:
        self._inner.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_insecure_port(self, address: str) -> int:
        return self._inner.add_insecure_port(address)

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        return self._inner.add_secure_port(address, server_credentials)

    async def start(self) -> None:
        await self._inner.start()

    async def stop(self, grace: float | None = None) -> None:
        if not self._stopped:
            self._stopped = True
            await self._cleanup(grace)
        await self._inner.stop(grace)

    async def wait_for_termination(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 (grpc's API)
        return await self._inner.wait_for_termination(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def create_server(
    settings: GatewaySettings,
    *,
    tracer_provider: TracerProvider | None = None,
    seams: GatewaySeams | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Start the GatewayService on ``settings.host:settings.port`` (0 picks a port) and return it.

    The Prometheus endpoint starts on ``settings.metrics_port`` (0 picks one; read it from
    ``server.metrics_port``). Stopping the returned server cancels running sessions (they tear down) and closes
    the clients.
    """
    seams = seams or GatewaySeams()
    closers: list[Callable[[], Awaitable[None]]] = []

    def client(address: str, cls: Callable[..., Any]) -> Any:
        if not address:
            return None
        made = cls(address, auth_token=settings.auth_token, tracer_provider=tracer_provider, tls=settings.tls())
        closers.append(made.close)
        return made

    endpoint: MetricsEndpoint | None = None
    metrics: GatewayMetrics | None = None
    if settings.metrics_port >= 0:
        endpoint = MetricsEndpoint()
        metrics = GatewayMetrics(endpoint.meter_provider)
    bin_dir = PurePosixPath(settings.harness_bin_dir) if settings.harness_bin_dir else None
    if settings.tunnel_dir:
        tunnel = ProxyTunnel(Path(settings.tunnel_dir), sandbox_port=settings.sandbox_proxy_port)
    else:
        tunnel = ProxyTunnel.under(settings.state_dir, sandbox_port=settings.sandbox_proxy_port)
    closers.append(tunnel.close)
    pipeline = SessionPipeline(
        settings,
        gateway_id=settings.gateway_id,
        runtimes=seams.runtimes
        or SpecRuntimeFactory(
            DefaultRuntimeFactory(base_dir=settings.state_dir / "runtimes"),
            default_kind=settings.default_runtime,
            defaults=_runtime_defaults(settings),
            tunnel=tunnel,
        ),
        agents=seams.agents
        or HarnessAgentRunner(
            workspace_dir=settings.workspace_dir, bin_dir=bin_dir, tunnel=tunnel, default_model=settings.default_model
        ),
        proxy=seams.proxy or client(settings.proxy_address, GrpcProxyClient) or _NoProxy(),
        reconstructor=seams.reconstructor or client(settings.reconstructor_address, GrpcReconstructorClient),
        evaluator=seams.evaluator or client(settings.evaluator_address, GrpcEvaluatorClient),
        sink=seams.sink or client(settings.rollout_address, GrpcResultSink),
        metrics=metrics,
        tracer=tracer_provider.get_tracer("gateway") if tracer_provider is not None else None,
    )
    servicer = GatewayServicer(pipeline)
    registration = ServiceRegistration(
        _SERVICE.full_name,
        lambda server: gateway_service_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server),
    )
    inner, port = await start_service_server([registration], settings, tracer_provider=tracer_provider)
    pipeline.gateway_id = settings.gateway_id or f"gateway-{port}"
    metrics_port = endpoint.start(settings.metrics_host, settings.metrics_port) if endpoint is not None else -1
    membership: RegistrationLoop | None = None
    if settings.rollout_address:
        registrar = client(settings.rollout_address, GrpcRolloutRegistrar)
        membership = RegistrationLoop(
            pipeline,
            registrar,
            address=_advertised(settings, port),
            labels={"runtime": settings.default_runtime, "network": settings.runtime_network},
            version=_version(),
        )
        membership.start()

    async def cleanup(grace: float | None) -> None:
        if membership is not None:
            await membership.stop()
        await pipeline.close(grace_s=grace if grace is not None else 0.0)
        await _close_all(closers)
        if endpoint is not None:
            endpoint.stop()

    server = _GatewayServer(inner, cleanup)
    server.metrics_port = metrics_port  # type: ignore[attr-defined]
    server.pipeline = pipeline  # type: ignore[attr-defined]
    server.membership = membership  # type: ignore[attr-defined]
    return server, port


def _advertised(settings: GatewaySettings, port: int) -> str:
    """The address the rollout server should dial for this gateway."""
    if settings.advertise_address:
        return settings.advertise_address
    host = settings.host
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.gethostname()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _version() -> str:
    try:
        return importlib.metadata.version("polar-rollout")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _runtime_defaults(settings: GatewaySettings) -> dict[str, Any]:
    """Runtime options every task gets unless its runtime table says otherwise."""
    defaults: dict[str, Any] = {"network": settings.runtime_network}
    if settings.harness_bin_dir:
        # ``node_modules/.bin`` holds symlinks into ``node_modules``: the sandbox must see the whole tree.
        bin_dir = Path(settings.harness_bin_dir)
        defaults["read_only_paths"] = [str(bin_dir.parent if bin_dir.name == ".bin" else bin_dir)]
    return defaults


async def _close_all(closers: Iterable[Callable[[], Awaitable[None]]]) -> None:
    for close in closers:
        await close()


def main() -> None:
    """Run the GatewayService until SIGTERM."""
    settings = GatewaySettings.load()
    provider = create_tracer_provider("gateway")
    asyncio.run(run_until_signal(lambda: create_server(settings, tracer_provider=provider), name="gateway"))
