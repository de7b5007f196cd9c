"""The gateway application: builds the session pipeline and everything it owns from :class:`GatewaySettings`.

:meth:`GatewayApp.open` makes the gRPC clients (proxy, reconstructor, evaluator, rollout server), the proxy
tunnel, the runtime factory and harness runner, the pipeline, the Prometheus endpoint and, with a rollout
server, the registration loop; :meth:`GatewayApp.close` releases them. :mod:`gateway.server` serves it.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path, PurePosixPath
from typing import Any, Self

from opentelemetry.sdk.trace import TracerProvider

from gateway.agent import HarnessAgentRunner, SpecRuntimeFactory
from gateway.clients import (
    GrpcEvaluatorClient,
    GrpcProxyClient,
    GrpcReconstructorClient,
    GrpcResultSink,
    GrpcRolloutRegistrar,
)
from gateway.core import SessionPipeline
from gateway.dependencies import PROXY, DependencyMonitor
from gateway.metrics import GatewayMetrics
from gateway.models import PipelineConfig, ProxyEndpoints, SessionSpec
from gateway.ports import (
    AgentRunner,
    EvaluatorClient,
    HealthProbe,
    ProxyClient,
    ReconstructorClient,
    ResultSink,
    RuntimeFactory,
)
from gateway.registration import RegistrationLoop
from gateway.settings import GatewaySettings
from gateway.tunnel import ProxyTunnel
from polar_core.errors import FailedPrecondition, InvalidArgument, Unauthenticated
from polar_core.gateway_tokens import read_claims
from polar_core.metrics import MetricsEndpoint
from polar_core.records import CompletionRecord
from polar_core.roles import Role
from polar_core.version import polar_version
from runtimes import DefaultRuntimeFactory, Isolation
from runtimes.local import IsolationProbe, probe_isolation
from runtimes.sandbox_policy import OperatorPolicy

__all__ = [
    "GatewayApp",
    "GatewaySeams",
    "harness_bin_dir",
    "identity_gateway_id",
    "operator_policy",
    "pipeline_config",
    "task_roots",
]

_log = logging.getLogger(__name__)

# The checkout this package runs from (``scripts/setup_harnesses.sh`` installs ``.harnesses`` there).
_CHECKOUT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class GatewaySeams:
    """Ports to use instead of the ones built from settings (embedded wiring and tests); ``None`` builds it.

    ``isolation`` replaces the host's isolation probe (:func:`runtimes.local.probe_isolation`), which the gateway
    otherwise runs once at open when it builds local runtimes itself.
    """

    runtimes: RuntimeFactory | None = None
    agents: AgentRunner | None = None
    proxy: ProxyClient | None = None
    reconstructor: ReconstructorClient | None = None
    evaluator: EvaluatorClient | None = None
    sink: ResultSink | None = None
    isolation: IsolationProbe | None = None


class _NoProxy:
    """Stands in when no proxy address is configured: every session fails at INIT, visibly."""

    async def open_session(self, spec: SessionSpec, model: str, *, timeout_s: float) -> ProxyEndpoints:
        raise FailedPrecondition("the gateway has no model proxy configured (set POLAR_GATEWAY_PROXY_ADDRESS)")

    async def close_session(self, session_id: str, *, timeout_s: float) -> int:
        return 0

    async def list_completions(self, session_id: str, *, timeout_s: float) -> list[CompletionRecord]:
        return []


class _Clients:
    """Makes the gRPC clients of the settings' addresses and remembers what to close."""

    def __init__(self, settings: GatewaySettings, tracer_provider: TracerProvider | None) -> None:
        self._settings = settings
        self._tracer_provider = tracer_provider
        self.closers: list[Callable[[], Awaitable[None]]] = []

    def make(self, address: str, cls: Callable[..., Any], *, token: str = "") -> Any:
        """Return a ``cls`` client of ``address`` presenting ``token`` (default: the gateway role's), or ``None``
        for an empty address."""
        if not address:
            return None
        s = self._settings
        made = cls(
            address,
            auth_token=token or s.presented_token(Role.GATEWAY),
            tracer_provider=self._tracer_provider,
            tls=s.tls(),
            max_message_bytes=s.max_message_bytes,
        )
        self.closers.append(made.close)
        return made

    def probed(self, probes: dict[str, HealthProbe], name: str, address: str, cls: Callable[..., Any]) -> Any:
        """Like :meth:`make`, and add the client to ``probes`` as the health probe of dependency ``name``."""
        made = self.make(address, cls)
        if made is not None:
            probes[name] = made
        return made


class GatewayApp:
    """The session pipeline and what it owns.

    Attributes:
        pipeline: The domain entry the servicer delegates to.
        membership: The registration loop with the rollout server (``None`` without ``rollout_address``);
            started by :meth:`start_membership` once the gRPC port is known.
        metrics_port: Port of the Prometheus endpoint (-1 when disabled).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        pipeline: SessionPipeline,
        clients: _Clients,
        endpoint: MetricsEndpoint | None,
    ) -> None:
        self._settings = settings
        self.pipeline = pipeline
        self._clients = clients
        self._endpoint = endpoint
        self.membership: RegistrationLoop | None = None
        self.metrics_port = -1
        self._drain_announced = False

    @classmethod
    async def open(
        cls,
        settings: GatewaySettings,
        *,
        tracer_provider: TracerProvider | None = None,
        seams: GatewaySeams | None = None,
    ) -> Self:
        """Build the pipeline and its ports from ``settings``; ``seams`` replaces any of the ports."""
        seams = seams or GatewaySeams()
        token_id = identity_gateway_id(settings)
        clients = _Clients(settings, tracer_provider)
        endpoint: MetricsEndpoint | None = None
        metrics: GatewayMetrics | None = None
        if settings.metrics_port >= 0:
            endpoint = MetricsEndpoint(service_name="polar-gateway")
            metrics = GatewayMetrics(endpoint.meter_provider)
        tunnel = _tunnel(settings)
        clients.closers.append(tunnel.close)
        bin_dir = harness_bin_dir(settings)
        probes: dict[str, HealthProbe] = {}
        proxy = seams.proxy or clients.probed(probes, PROXY, settings.proxy_address, GrpcProxyClient)
        reconstructor = seams.reconstructor or clients.probed(
            probes, "reconstructor", settings.reconstructor_address, GrpcReconstructorClient
        )
        evaluator = seams.evaluator or clients.probed(
            probes, "evaluator", settings.evaluator_address, GrpcEvaluatorClient
        )
        monitor = DependencyMonitor(
            probes if settings.dependency_probes else {}, interval_s=settings.dependency_probe_interval_s
        )
        isolation, cannot_run = await _isolation(settings, seams)
        pipeline = SessionPipeline(
            pipeline_config(settings),
            gateway_id=settings.gateway_id or token_id,
            runtimes=seams.runtimes or _runtimes(settings, tunnel, bin_dir, isolation),
            agents=seams.agents or _agents(settings, tunnel, bin_dir),
            proxy=proxy or _NoProxy(),
            reconstructor=reconstructor,
            evaluator=evaluator,
            sink=seams.sink or clients.make(settings.rollout_address, GrpcResultSink, token=settings.identity_token),
            metrics=metrics,
            tracer=tracer_provider.get_tracer("gateway") if tracer_provider is not None else None,
            dependencies=monitor,
            cannot_run=cannot_run,
        )
        monitor.start()
        clients.closers.insert(0, monitor.stop)
        app = cls(settings, pipeline, clients, endpoint)
        if endpoint is not None:
            app.metrics_port = endpoint.start(
                settings.metrics_host, settings.metrics_port, token=settings.metrics_token
            )
        return app

    def serving(self, port: int) -> None:
        """The gRPC server listens on ``port``: name the gateway after it and join the rollout server's pool."""
        settings = self._settings
        self.pipeline.gateway_id = self.pipeline.gateway_id or f"gateway-{port}"
        if not settings.rollout_address:
            return
        self.membership = RegistrationLoop(
            self.pipeline,
            self._clients.make(settings.rollout_address, GrpcRolloutRegistrar, token=settings.identity_token),
            address=_advertised(settings, port),
            labels={"runtime": settings.default_runtime, "network": settings.runtime_network},
            version=polar_version(),
        )
        self.membership.start()

    async def drain_for_exit(self) -> int:
        """Before a planned exit (``polar serve`` on SIGUSR1, e.g. Slurm's ``--signal`` before the time limit):
        take no new session (the next heartbeat tells the rollout server), and wait up to the ``drain_timeout_s``
        setting for the running ones to finish. Return how many still run; :meth:`shut_down` hands them back."""
        await self._announce_drain()
        _log.info(
            "gateway %s draining for exit (up to %.0f s)", self.pipeline.gateway_id, self._settings.drain_timeout_s
        )
        return await self.pipeline.wait_idle(self._settings.drain_timeout_s)

    async def _announce_drain(self) -> None:
        """Refuse new sessions and, while some still run, tell the rollout server now rather than at the next
        heartbeat, so it sends none here meanwhile (once; a refused StartSession would cost no attempt either)."""
        self.pipeline.drain()
        if self.membership is not None and not self._drain_announced and self.pipeline.capacity().active:
            self._drain_announced = True
            await self.membership.announce(timeout_s=2.0)

    async def shut_down(self, grace_s: float) -> None:
        """Leave the rollout server's pool, stop running sessions and wait up to ``grace_s`` for their teardown
        (the gRPC server still answers meanwhile, so watchers see them end). The stopped sessions are handed back:
        each reports ``infra_error`` as an outage, which the rollout server runs again elsewhere without using up
        an attempt. The rollout server learns that the gateway drains first, so it does not dispatch the handed
        back sessions here again. Idempotent."""
        self.pipeline.hand_back_all()  # before any await: a signal to the whole job also hits the sandboxes
        await self._announce_drain()
        await self.pipeline.close(grace_s=grace_s, hand_back=True)
        if self.membership is not None:
            await self.membership.stop()

    async def close(self) -> None:
        """Shut down (without grace, unless :meth:`shut_down` ran first), then close the clients, the tunnel
        and the metrics endpoint."""
        await self.shut_down(0.0)
        for close in self._clients.closers:
            await close()
        if self._endpoint is not None:
            self._endpoint.stop()


def identity_gateway_id(settings: GatewaySettings, *, now: float | None = None) -> str:
    """The gateway id the settings' ``identity_token`` names ("" without one).

    The gateway cannot check the token's signature (only the rollout server holds the key), but refuses to start
    with a token that cannot work: malformed, expired, or naming another gateway than ``gateway_id``.

    Raises:
        InvalidArgument: The token is malformed, expired, or for another gateway id than ``gateway_id``.
    """
    if not settings.identity_token:
        return ""
    try:
        claims = read_claims(settings.identity_token)
    except Unauthenticated as exc:
        raise InvalidArgument(f"identity_token (POLAR_GATEWAY_IDENTITY_TOKEN): {exc.message}") from None
    if settings.gateway_id and settings.gateway_id != claims.gateway_id:
        raise InvalidArgument(
            f"identity_token is for gateway {claims.gateway_id!r}, but gateway_id is {settings.gateway_id!r}: "
            "issue a token for this gateway's id, or leave gateway_id empty to take the token's"
        )
    if (time.time() if now is None else now) >= claims.expires_at:
        raise InvalidArgument(
            f"identity_token for {claims.describe()}, has expired: issue a new one "
            f"(polar token issue --gateway-id {claims.gateway_id})"
        )
    return claims.gateway_id


def pipeline_config(settings: GatewaySettings) -> PipelineConfig:
    """The pipeline's configuration: the settings' fields of the same names."""
    return PipelineConfig(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(PipelineConfig)})


def _tunnel(settings: GatewaySettings) -> ProxyTunnel:
    if settings.tunnel_dir:
        return ProxyTunnel(Path(settings.tunnel_dir), sandbox_port=settings.sandbox_proxy_port)
    return ProxyTunnel.under(settings.state_dir, sandbox_port=settings.sandbox_proxy_port)


def harness_bin_dir(settings: GatewaySettings, *, cwd: Path | None = None) -> Path | None:
    """The directory of the harness CLIs: the setting, else the ``.harnesses/node_modules/.bin`` that
    ``scripts/setup_harnesses.sh`` installs, in the working directory or the checkout (as ``polar run`` finds it)."""
    if settings.harness_bin_dir:
        return Path(settings.harness_bin_dir)
    for root in ((cwd or Path.cwd()) / ".harnesses", _CHECKOUT / ".harnesses"):
        candidate = root / "node_modules" / ".bin"
        if candidate.is_dir():
            return candidate.resolve()
    return None


def operator_policy(settings: GatewaySettings) -> OperatorPolicy:
    """What the gateway's settings allow tasks beyond its runtime options."""
    return OperatorPolicy(
        min_isolation=Isolation(settings.min_isolation),
        read_only_roots=tuple(Path(p) for p in settings.read_only_roots),
        images=tuple(settings.allowed_images),
    )


def task_roots(settings: GatewaySettings, *, cwd: Path | None = None) -> tuple[Path, ...]:
    """The directories task paths must lie under: the setting, else the working directory."""
    if settings.task_roots:
        return tuple(Path(p).absolute() for p in settings.task_roots)
    return ((cwd or Path.cwd()).absolute(),)


async def _isolation(settings: GatewaySettings, seams: GatewaySeams) -> tuple[IsolationProbe | None, str]:
    """Probe (once) what isolation this host provides; return the probe and why no session can run, if so.

    Nothing is probed for a gateway of container runtimes, or one whose runtimes a seam replaces (fakes).
    """
    probed = seams.isolation
    if probed is None and (settings.default_runtime != "local" or seams.runtimes is not None):
        return None, ""
    minimum = Isolation(settings.min_isolation)
    probe = probed or await probe_isolation(minimum)
    shortfall = probe.shortfall(minimum)
    if shortfall is not None:
        _log.error("gateway refuses every session: %s (set POLAR_GATEWAY_MIN_ISOLATION to allow weaker)", shortfall)
        return probe, shortfall
    if minimum.rank < Isolation.BWRAP.rank:
        _log.warning("gateway allows weak isolation (min_isolation=%s); this host provides %s",
                     minimum.value, probe.best.value)  # fmt: skip
    return probe, ""


def _runtimes(
    settings: GatewaySettings, tunnel: ProxyTunnel, bin_dir: Path | None, isolation: IsolationProbe | None
) -> RuntimeFactory:
    defaults = _runtime_defaults(settings, bin_dir)
    if isolation is not None:
        # Probed once here: every session uses the strongest level this host provides.
        defaults["isolation"] = isolation.best.value
    return SpecRuntimeFactory(
        DefaultRuntimeFactory(base_dir=settings.state_dir / "runtimes"),
        default_kind=settings.default_runtime,
        defaults=defaults,
        tunnel=tunnel,
        policy=operator_policy(settings),
    )


def _agents(settings: GatewaySettings, tunnel: ProxyTunnel, bin_dir: Path | None) -> AgentRunner:
    return HarnessAgentRunner(
        workspace_dir=settings.workspace_dir,
        bin_dir=PurePosixPath(bin_dir) if bin_dir is not None else None,
        tunnel=tunnel,
        default_model=settings.default_model,
        check_programs=settings.default_runtime == "local",
        task_roots=task_roots(settings),
    )


def _runtime_defaults(settings: GatewaySettings, bin_dir: Path | None) -> dict[str, Any]:
    """Runtime options every task gets unless its runtime table says otherwise."""
    defaults: dict[str, Any] = {"network": settings.runtime_network, "min_isolation": settings.min_isolation}
    if settings.docker_host:
        defaults["docker_host"] = settings.docker_host
    if bin_dir is not None:
        # ``node_modules/.bin`` holds symlinks into ``node_modules``: the sandbox must see the whole tree, and the
        # Python agents' venvs beside it (``.harnesses/py``, found from ``bin_dir``), so the harness root.
        root = bin_dir.parent if bin_dir.name == ".bin" else bin_dir
        if root.name == "node_modules":
            root = root.parent
        defaults["read_only_paths"] = [str(root)]
    return defaults


def _advertised(settings: GatewaySettings, port: int) -> str:
    """The address the rollout server should dial for this gateway."""
    if settings.advertise_address:
        return settings.advertise_address
    host = settings.host
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.gethostname()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
