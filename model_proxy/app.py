"""The model proxy as one object: sessions, engine and the provider HTTP server (uvicorn, own port).

:meth:`ProxyApp.open` builds everything from :class:`~model_proxy.settings.ProxySettings` (the policy's
tokenizer, the backend, the session store, the engine and its typed :class:`~model_proxy.models.EngineConfig`)
and starts it; ``model_proxy.server`` registers :class:`~model_proxy.servicer.ModelProxyServicer` over it and
tells the app its gRPC port (:meth:`ProxyApp.serving`), from which the app joins its rollout server's fleet.
Every collaborator is built once, in the constructor, and handed to the objects that use it.
Tests and embedders that bring their own backend construct :class:`ProxyApp` and call :meth:`ProxyApp.start`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from typing import Any, Self

import uvicorn
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.trace import TracerProvider

from model_proxy.core import ChatRenderer, ProxyEngine, SessionRegistry, SessionStore, build_rules, create_parser
from model_proxy.fleet_membership import FleetMembership
from model_proxy.http.app import ProxyHttp
from model_proxy.metrics import GateView, ProxyMetrics
from model_proxy.models import EngineConfig
from model_proxy.policy import load_policy, make_backend
from model_proxy.ports import Backend
from model_proxy.rollout_client import GrpcRolloutRegistrar
from model_proxy.settings import ProxySettings
from model_proxy.weights import WeightManager
from polar_core.errors import FailedPrecondition
from polar_core.metrics import MetricsEndpoint
from polar_core.roles import Role

__all__ = ["ProxyApp", "engine_config", "resolve_context_length", "stop_token_ids"]

_log = logging.getLogger(__name__)
_END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "</s>")


def stop_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """The IDs that end a turn: the tokenizer's EOS plus well-known end-of-turn tokens it has."""
    ids: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.append(eos)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    ids.extend(vocab[t] for t in _END_OF_TURN_TOKENS if t in vocab)
    return tuple(dict.fromkeys(ids))


def resolve_context_length(settings: ProxySettings, backend: Backend, tokenizer: Any) -> int:
    """Settings first, then the backend's ``context_length``, then the tokenizer's, else 32768."""
    if settings.context_length:
        return settings.context_length
    for source in (backend, tokenizer):
        value = getattr(source, "context_length", None) or getattr(source, "model_max_length", None)
        if isinstance(value, int) and 0 < value < 10_000_000:
            return value
    return 32768


def engine_config(settings: ProxySettings, backend: Backend, tokenizer: Any) -> EngineConfig:
    """The engine's typed configuration from the settings, the backend and the tokenizer."""
    return EngineConfig(
        context_length=resolve_context_length(settings, backend, tokenizer),
        default_max_tokens=settings.default_max_tokens,
        backend_timeout_s=settings.backend_timeout_s,
        stop_token_ids=stop_token_ids(tokenizer),
    )


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit this on Linux: no Nagle delay between SSE events or response parts.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class ProxyApp:
    """Sessions, the call engine and the provider HTTP server of one proxy process."""

    def __init__(
        self,
        settings: ProxySettings,
        backend: Backend,
        tokenizer: Any,
        *,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """Build the proxy (nothing starts until :meth:`start`).

        Args:
            settings: Proxy settings.
            backend: The inference backend (started and closed with the proxy).
            tokenizer: The policy model's Hugging Face tokenizer.
            tracer_provider: Provider for spans; None uses the global one.
        """
        self.settings = settings
        self.backend = backend
        self._tracer_provider = tracer_provider
        # The endpoint's provider exists from here (the instruments are made once); start() binds its port.
        endpoint = MetricsEndpoint(service_name="polar-proxy") if settings.metrics_port >= 0 else None
        self._metrics_endpoint = endpoint
        self.metrics = (
            ProxyMetrics(endpoint.meter_provider, self._gate_view()) if endpoint else ProxyMetrics(NoOpMeterProvider())
        )
        store = SessionStore(settings.state_dir / "proxy", fsync=settings.fsync)
        self.registry = SessionRegistry(
            store,
            prefix_cache_entries=settings.prefix_cache_entries,
            closed_in_memory=settings.closed_sessions_in_memory,
        )
        self.engine = ProxyEngine(
            backend=backend,
            tokenizer=tokenizer,
            renderer=ChatRenderer(tokenizer, chat_template=settings.chat_template, verify=settings.verify_prefix_cache),
            parser=create_parser(settings.tool_call_parser),
            rules=build_rules(settings.normalization_rules, settings.strip_system_line_patterns),
            registry=self.registry,
            config=engine_config(settings, backend, tokenizer),
            policy_version=settings.policy_version,
            tracer=tracer_provider.get_tracer("model_proxy") if tracer_provider is not None else None,
            metrics=self.metrics,
        )
        self.weights = WeightManager(self.engine, backend)
        self.membership: FleetMembership | None = None  # started by serving() when rollout_address is set
        self.http = ProxyHttp(
            self.engine,
            retry_after_s=settings.retry_after_s,
            max_body_bytes=settings.max_body_bytes,
            model_name=settings.model_name,
            max_calls_per_session=settings.max_calls_per_session,
            offload_bytes=settings.offload_bytes,
        )
        self._server: uvicorn.Server | None = None
        self._main: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None
        self.http_port = 0
        self.metrics_port = -1

    def _gate_view(self) -> GateView:
        """What the gauges read at each scrape: the engine's gate and stamped version (read then, not now)."""
        return GateView(
            in_flight=lambda: self.engine.gate.in_flight,
            paused_calls=lambda: self.engine.gate.held,
            paused=lambda: self.engine.gate.paused,
            policy_version=lambda: self.engine.policy_version,
        )

    def _start_metrics(self) -> None:
        """Serve ``/metrics`` per the settings (before the first call); nothing when metrics are off."""
        endpoint = self._metrics_endpoint
        if endpoint is None:
            return
        try:
            self.metrics_port = endpoint.start(
                self.settings.metrics_host, self.settings.metrics_port, token=self.settings.metrics_token
            )
        except BaseException:
            self._metrics_endpoint = None
            endpoint.stop()
            raise

    @classmethod
    async def open(
        cls,
        settings: ProxySettings,
        *,
        tracer_provider: TracerProvider | None = None,
        backend: Backend | None = None,
        tokenizer: Any | None = None,
    ) -> Self:
        """Load the policy, build the backend from the settings and start the proxy.

        Args:
            settings: Proxy settings (``model``, ``backend`` and ``backend_options`` pick the policy and backend).
            tracer_provider: Provider for spans; None uses the global one.
            backend: A backend to use instead of the one the settings name.
            tokenizer: The policy's tokenizer, when the caller has it loaded already.
        """
        if backend is None or tokenizer is None:
            weights = backend is None and settings.backend == "transformers"
            policy = await asyncio.to_thread(load_policy, settings.model, with_weights=weights)
            tokenizer = policy.tokenizer if tokenizer is None else tokenizer
            backend = make_backend(settings.backend, settings.backend_options, policy) if backend is None else backend
        app = cls(settings, backend, tokenizer, tracer_provider=tracer_provider)
        if settings.rollout_address:
            # Hold every call until the fleet's policy is served (model_proxy.server joins the fleet).
            await app.engine.gate.pause(abort_in_flight=False, drain_timeout_s=1.0)
        await app.start()
        return app

    @property
    def base_url(self) -> str:
        """The base URL harnesses use (``public_base_url`` or ``http://host:port``)."""
        if self.settings.public_base_url:
            return self.settings.public_base_url.rstrip("/")
        host = self.settings.http_host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.http_port}"

    @property
    def drain_timeout_s(self) -> float:
        """How long ``PauseGeneration`` waits for in-flight calls to finish."""
        return self.settings.drain_timeout_s

    async def start(self) -> int:
        """Load stored sessions, start the backend and the HTTP server; returns the HTTP port (idempotent)."""
        if self._server is not None:
            return self.http_port
        loaded = await asyncio.to_thread(self.registry.load)
        if loaded:
            _log.info("loaded %d stored sessions", loaded)
        recovery = self.registry.recovery
        if not recovery.clean:
            _log.error(
                "stored sessions repaired at start: %d corrupt session files (%d sessions restored closed), "
                "%d bad record lines quarantined, %d torn last lines cut off",
                len(recovery.corrupt_sessions),
                len(recovery.restored_closed),
                recovery.quarantined_lines,
                recovery.torn_tails,
            )
        await self.backend.start()
        self._start_metrics()
        sock = _listen(self.settings.http_host, self.settings.http_port)
        config = uvicorn.Config(
            self.http.app,
            log_level="warning",
            access_log=False,  # access logs would print ?key= query strings
            lifespan="off",
            timeout_graceful_shutdown=5,
            server_header=False,
        )
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        if server.should_exit:
            sock.close()
            raise FailedPrecondition("the proxy's HTTP server failed to start")
        self._server, self._sock = server, sock
        self.http_port = sock.getsockname()[1]
        if self.settings.gc_freeze:
            gc.collect()
            gc.freeze()
            if self.settings.gc_young_threshold:
                gc.set_threshold(self.settings.gc_young_threshold, *gc.get_threshold()[1:])
        self._main = asyncio.create_task(server.main_loop())
        return self.http_port

    def serving(self, port: int) -> None:
        """The gRPC server listens on ``port``: join the rollout server's fleet when ``rollout_address`` is set.

        The gate must be paused (:meth:`open` pauses it): calls are held until the fleet's policy is served.
        """
        settings = self.settings
        if not settings.rollout_address or self.membership is not None:
            return
        address = settings.advertise_address or _advertised(settings.host, port)
        registrar = GrpcRolloutRegistrar(
            settings.rollout_address,
            auth_token=settings.presented_token(Role.INTERNAL),
            tracer_provider=self._tracer_provider,
            tls=settings.tls(),
        )
        self.membership = FleetMembership(
            self.weights,
            self.engine.gate,
            registrar,
            proxy_id=settings.proxy_id or f"proxy-{address}",
            address=address,
            backend=settings.backend,
        )
        self.membership.start()

    async def close(self) -> None:
        """Leave the fleet, stop the HTTP server and close the backend (idempotent)."""
        membership, self.membership = self.membership, None
        if membership is not None:
            await membership.stop()
        server, self._server = self._server, None
        if server is not None:
            server.should_exit = True
            if self._main is not None:
                await self._main
            await server.shutdown(sockets=[self._sock] if self._sock else None)
        await self.backend.close()
        endpoint, self._metrics_endpoint = self._metrics_endpoint, None
        if endpoint is not None:
            endpoint.stop()


def _advertised(host: str, port: int) -> str:
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.gethostname()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
