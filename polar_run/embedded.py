"""The embedded stack: all five services in this process, on 127.0.0.1 and free ports, sharing one token.

``polar run`` and ``polar generate`` use it; tests and notebooks can too::

    async with EmbeddedStack.start(StackOptions(state_dir=Path("run/state"))) as stack:
        async with RolloutClient(stack.rollout_address, token=stack.token) as client:
            ...

Start order follows the dependencies: the model proxy (it loads the policy; the slow part), the reconstructor
and the evaluator, then the gateway (which needs their addresses), then the rollout server with the gateway
in its static gateway list. The gateway reports results to the rollout server, whose port is only known once
it has started, so the gateway gets a sink that is connected to it afterwards. Everything stops in reverse
order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from polar_core.errors import FailedPrecondition, InvalidArgument, PolarError, Unavailable
from polar_core.server import RunningService
from polar_core.tracing import create_tracer_provider
from polar_run.settings import RunSettings
from runtimes.sandbox_policy import TaskAdmission

if TYPE_CHECKING:
    from rollout_server.dashboard import Dashboard

__all__ = [
    "METRICS_OFFSETS",
    "EmbeddedStack",
    "StackOptions",
    "context_length",
    "end_of_turn_ids",
    "serve_stored_policy",
]

_log = logging.getLogger(__name__)
_HOST = "127.0.0.1"
METRICS_OFFSETS = {"gateway": 0, "proxy": 1, "rollout": 2, "reconstructor": 3, "evaluator": 4}
"""Each service's metrics port relative to ``StackOptions.metrics`` (the images' 9464 to 9468)."""
_STOP_GRACE_S = 5.0


@dataclasses.dataclass(frozen=True, slots=True)
class StackOptions:
    """How to configure the embedded stack.

    Attributes:
        state_dir: Parent of each service's state directory (SQLite store, completion records, runtimes).
        model: Policy model of the proxy: ``smollm2``, ``tiny`` or a Hugging Face model directory.
        backend: Inference backend name (``transformers``, ``scripted``, ``vllm``, ...).
        backend_options: The backend's options.
        default_max_tokens: Proxy output limit for calls that give none (0: up to the context).
        context_length: The model's context in tokens (0: ask the backend or tokenizer); with the in-process
            ``transformers`` backend it is also the backend's ``max_context`` unless its options set one.
        harness_bin_dir: Directory holding the installed harness CLIs, as runtimes see it.
        running_workers: Harnesses run at once on the gateway.
        init_workers: Sessions prepared at once on the gateway (default: half the cores, at least 2).
        postrun_workers: Sessions evaluated and reconstructed at once on the gateway (default: one per core, at
            least 2: an evaluation is mostly CPU, the task's test run; docs/gateway.md, "Host capacity").
        max_attempts: Attempts per session (only ``infra_error`` is retried; each attempt records into its own
            proxy session).
        session_grace_s: Slack on top of a task's ``timeout_seconds`` for runtime start and evaluation.
        fsync: Whether the proxy fsyncs each completion record.
        task_roots: Directories the tasks' repository and test-patch paths must lie under (gateway, evaluator and
            rollout server alike); ``polar run`` gives the task file's directory, ``polar generate`` the
            dataset's and each task file's. Empty means the working directory.
        read_only_roots: Where a task's ``runtime.read_only_paths`` may lie; the harness installation (above
            ``harness_bin_dir``) is always allowed.
        allowed_images: Container images tasks may name (the services' ``allowed_images``): ``polar run`` and
            ``polar generate`` allow exactly the images they built for Harbor tasks.
        dashboard: Serve the rollout server's live dashboard on a free loopback port (``polar run``), opened by
            a per-run dashboard key (:attr:`EmbeddedStack.dashboard_url` carries it).
        metrics: Serve every service's Prometheus endpoint on loopback (``polar run --metrics``): 0 on free
            ports; a port N on N for the gateway, N+1 the proxy, N+2 the rollout server, N+3 the reconstructor and
            N+4 the evaluator (from 9464: the images' ports, ``docs/observability.md``). ``None``: only the
            proxy's, and only with the dashboard (which reads it).
        jaeger_url: Jaeger's UI (``polar run --jaeger-url``): the dashboard links each task's sessions to their
            trace there (the rollout server's ``dashboard_jaeger_url``).
    """

    state_dir: Path
    model: str = "smollm2"
    backend: str = "transformers"
    backend_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    default_max_tokens: int = 0
    context_length: int = 0
    harness_bin_dir: Path | None = None
    running_workers: int = 4
    init_workers: int = dataclasses.field(default_factory=lambda: max(2, (os.cpu_count() or 1) // 2))
    postrun_workers: int = dataclasses.field(default_factory=lambda: max(2, os.cpu_count() or 1))
    max_attempts: int = 2
    session_grace_s: float = 300.0
    fsync: bool = False
    task_roots: tuple[Path, ...] = ()
    read_only_roots: tuple[Path, ...] = ()
    allowed_images: tuple[str, ...] = ()
    dashboard: bool = False
    metrics: int | None = None
    jaeger_url: str = ""

    def __post_init__(self) -> None:
        if self.metrics is not None and not 0 <= self.metrics <= 65535 - max(METRICS_OFFSETS.values()):
            raise InvalidArgument(
                f"the first metrics port must be 0 (free ports) or 1 to {65535 - max(METRICS_OFFSETS.values())}, "
                f"not {self.metrics}"
            )

    def metrics_port(self, service: str) -> int:
        """The ``metrics_port`` setting of ``service`` (a key of :data:`METRICS_OFFSETS`): -1 is none."""
        if self.metrics is None:
            return 0 if service == "proxy" and self.dashboard else -1
        return self.metrics + METRICS_OFFSETS[service] if self.metrics else 0

    def policy_settings(self) -> dict[str, Any]:
        """The operator-policy settings every embedded service gets (the same for all three)."""
        roots = [*self.read_only_roots]
        bin_dir = self.harness_bin_dir
        if bin_dir is not None:
            roots.append(bin_dir.parents[1] if bin_dir.name == ".bin" and len(bin_dir.parents) > 1 else bin_dir)
        task_roots = self.task_roots or (Path.cwd(),)
        return {
            "task_roots": [str(p.absolute()) for p in task_roots],
            "read_only_roots": [str(p) for p in roots],
            "allowed_images": list(self.allowed_images),
        }

    def admission(self) -> TaskAdmission:
        """The check the embedded rollout server runs at SubmitTask, to run before the stack starts."""
        settings = self.policy_settings()
        return TaskAdmission.of(
            task_roots=[Path(p) for p in settings["task_roots"]],
            read_only_roots=[Path(p) for p in settings["read_only_roots"]],
            images=list(self.allowed_images),
        )


def context_length(value: int | None, settings: RunSettings) -> int:
    """The embedded proxy's context length: ``value`` (``--context-length``), else the environment's
    (``POLAR_PROXY_CONTEXT_LENGTH``, :attr:`RunSettings.proxy_context_length`), else 0 (the model's own).

    Raises:
        InvalidArgument: ``value`` is not a positive integer.
    """
    if value is None:
        return settings.proxy_context_length
    if value < 1:
        raise InvalidArgument(f"--context-length must be at least 1, not {value}")
    return value


def end_of_turn_ids(tokenizer: Any) -> tuple[int, ...]:
    """The IDs that close an assistant turn in the policy's chat template, for the reconstructor.

    The reconstructor can detect them from completions, but only from calls that stopped on their own; when
    every call of a session was cut by ``max_tokens`` (common with a small model and a token cap) prefix
    merging would have nothing to go on. Known terminators the template writes come first, else the EOS.
    """
    from reconstructor.eot import KNOWN_END_OF_TURN_TOKENS

    vocab: dict[str, int] = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    template = str(getattr(tokenizer, "chat_template", None) or "")
    names = [t for t in KNOWN_END_OF_TURN_TOKENS if t in vocab and (not template or t in template)]
    if names:
        return tuple(vocab[n] for n in names)
    eos = getattr(tokenizer, "eos_token_id", None)
    return (eos,) if isinstance(eos, int) else ()


async def serve_stored_policy(proxy_app: Any, version: int, weights_path: str) -> None:
    """Make the proxy of ``proxy_app`` serve the fleet's stored policy (``version``, ``weights_path``).

    Version 0 (no update was ever stored) keeps the configured weights; a proxy already at or past ``version``
    is left alone (never go back). The gate is paused around the load, as ``LoadWeights`` requires; nothing
    has been submitted yet, so no call waits.

    Raises:
        FailedPrecondition: The stored checkpoint cannot be loaded (moved, deleted, another architecture): the
            stack does not start rather than serve other weights under the stored version's number.
    """
    weights = proxy_app.weights
    if version <= 0 or weights.version_number >= version:
        return
    gate = proxy_app.engine.gate
    await gate.pause(abort_in_flight=False, drain_timeout_s=1.0)
    try:
        await weights.load(version, weights_path)
    except PolarError as exc:
        raise FailedPrecondition(
            f"the state directory's policy v{version} ({weights_path}) cannot be loaded: {exc.message}; "
            "restore that checkpoint or start with a new state directory"
        ) from exc
    gate.resume()
    _log.info("serving the stored policy v%d from %s", version, weights_path)


class _LateSink:
    """The gateway's result sink, connected to the rollout server once that has started."""

    def __init__(self) -> None:
        self.target: Any = None

    async def report(self, result: Any) -> None:
        if self.target is None:
            raise Unavailable("the embedded rollout server has not started yet")
        await self.target.report(result)


def _proxy_settings(options: StackOptions, state: Path, token: str) -> Any:
    from model_proxy.settings import ProxySettings

    backend_options = dict(options.backend_options)
    if options.context_length and options.backend in ("transformers", "llama_cpp"):
        # The in-process model enforces its own limit (the tiny model's 4,096 positions) besides the proxy's.
        backend_options.setdefault("max_context", options.context_length)
    return ProxySettings(
        host=_HOST,
        http_host=_HOST,
        state_dir=state / "proxy",
        auth_token=token,
        model=options.model,
        backend=options.backend,
        backend_options=backend_options,
        default_max_tokens=options.default_max_tokens,
        context_length=options.context_length,
        fsync=options.fsync,
        # The dashboard reads call latency and tokens/s from here; without one, nothing is measured.
        metrics_host=_HOST,
        metrics_port=options.metrics_port("proxy"),
    )


def _gateway_settings(options: StackOptions, state: Path, token: str, ports: Mapping[str, int]) -> Any:
    from gateway.settings import GatewaySettings

    return GatewaySettings(
        host=_HOST,
        state_dir=state / "gateway",
        auth_token=token,
        gateway_id="embedded",
        proxy_address=f"{_HOST}:{ports['proxy']}",
        reconstructor_address=f"{_HOST}:{ports['reconstructor']}",
        evaluator_address=f"{_HOST}:{ports['evaluator']}",
        running_workers=options.running_workers,
        init_workers=options.init_workers,
        ready_capacity=max(1, options.init_workers),
        postrun_workers=options.postrun_workers,
        harness_bin_dir=str(options.harness_bin_dir) if options.harness_bin_dir else "",
        metrics_host=_HOST,
        metrics_port=options.metrics_port("gateway"),
        # Every service runs in this process: none can be unreachable, and a loop busy with the in-process
        # model must not look like an outage.
        dependency_probes=False,
        **options.policy_settings(),
    )


def _rollout_settings(
    options: StackOptions, state: Path, token: str, ports: Mapping[str, int], dashboard_key: str
) -> Any:
    from rollout_server.settings import RolloutSettings

    return RolloutSettings(
        dashboard_address=f"{_HOST}:0" if options.dashboard else "",
        dashboard_key=dashboard_key,
        dashboard_jaeger_url=options.jaeger_url,
        dashboard_proxy_metrics_urls=(
            [f"http://{_HOST}:{ports['proxy_metrics']}/metrics"] if ports.get("proxy_metrics", -1) >= 0 else []
        ),
        host=_HOST,
        state_dir=state / "rollout",
        auth_token=token,
        gateway_addresses=[f"{_HOST}:{ports['gateway']}"],
        max_attempts=options.max_attempts,
        session_grace_s=options.session_grace_s,
        dispatch_interval_s=0.2,
        heartbeat_interval_s=2.0,
        metrics_host=_HOST,
        metrics_port=options.metrics_port("rollout"),
        **options.policy_settings(),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class EmbeddedStack:
    """A running embedded stack: the addresses of its services and their shared control-plane token.

    ``dashboard_url`` (empty without ``StackOptions.dashboard``) opens the dashboard: it carries the per-run
    dashboard key, which shows the dashboard and opens nothing else. ``dashboard`` is the running dashboard itself,
    for in-process readers (tests, notebooks). ``metrics`` maps each service serving a Prometheus endpoint
    (``gateway``, ``proxy``, ``rollout``, ``reconstructor``, ``evaluator``) to its URL.
    """

    token: str
    rollout_address: str
    gateway_address: str
    proxy_address: str
    reconstructor_address: str
    evaluator_address: str
    options: StackOptions
    dashboard_url: str = ""
    dashboard: Dashboard | None = None
    metrics: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    @contextlib.asynccontextmanager
    async def start(cls, options: StackOptions) -> AsyncIterator[Self]:
        """Start the five services, yield the stack, and stop them all (also on errors and cancellation)."""
        # Imported here: each pulls in its service (the proxy pulls in transformers) only when a stack starts.
        from evaluator.server import start_server as start_evaluator
        from evaluator.settings import EvaluatorSettings
        from gateway.app import GatewaySeams
        from gateway.clients import GrpcResultSink
        from gateway.server import start_server as start_gateway
        from model_proxy.server import start_server as start_proxy
        from reconstructor.server import start_server as start_reconstructor
        from reconstructor.settings import ReconstructorSettings
        from rollout_server.server import start_server as start_rollout

        token = secrets.token_urlsafe(24)
        state = options.state_dir.absolute()
        ports: dict[str, int] = {}
        async with contextlib.AsyncExitStack() as stack:

            def stopping(service: RunningService[Any]) -> int:
                stack.push_async_callback(service.stop, _STOP_GRACE_S)
                return service.port

            proxy = await start_proxy(
                _proxy_settings(options, state, token), tracer_provider=create_tracer_provider("proxy")
            )
            ports["proxy"] = stopping(proxy)
            ports["proxy_metrics"] = proxy.app.metrics_port
            recon = await start_reconstructor(
                ReconstructorSettings(
                    host=_HOST,
                    state_dir=state / "reconstructor",
                    auth_token=token,
                    end_of_turn_ids=end_of_turn_ids(proxy.app.engine.tokenizer),
                    metrics_host=_HOST,
                    metrics_port=options.metrics_port("reconstructor"),
                ),
                tracer_provider=create_tracer_provider("reconstructor"),
            )
            ports["reconstructor"] = stopping(recon)
            evaluator = await start_evaluator(
                EvaluatorSettings(
                    host=_HOST,
                    state_dir=state / "evaluator",
                    auth_token=token,
                    metrics_host=_HOST,
                    metrics_port=options.metrics_port("evaluator"),
                    **options.policy_settings(),
                ),
                tracer_provider=create_tracer_provider("evaluator"),
            )
            ports["evaluator"] = stopping(evaluator)
            sink = _LateSink()
            gateway = await start_gateway(
                _gateway_settings(options, state, token, ports),
                tracer_provider=create_tracer_provider("gateway"),
                seams=GatewaySeams(sink=sink),
            )
            ports["gateway"] = stopping(gateway)
            dashboard_key = secrets.token_urlsafe(18) if options.dashboard else ""
            rollout = await start_rollout(
                _rollout_settings(options, state, token, ports, dashboard_key),
                tracer_provider=create_tracer_provider("rollout"),
            )
            stopping(rollout)
            # The proxy started first (its address is known only now), so it is registered here: UpdatePolicy
            # reaches it. On a state directory an earlier run left a policy in, it serves that policy before the
            # first call, as a proxy joining a fleet does (model_proxy/fleet_membership.py).
            policy = await rollout.app.policy.register_proxy(
                "embedded-proxy", f"{_HOST}:{ports['proxy']}", options.backend
            )
            await serve_stored_policy(proxy.app, policy.version, policy.weights_path)
            result_sink = GrpcResultSink(f"{_HOST}:{rollout.port}", auth_token=token)
            stack.push_async_callback(result_sink.close)
            sink.target = result_sink
            board = rollout.app.dashboard
            services: dict[str, RunningService[Any]] = {
                "gateway": gateway,
                "proxy": proxy,
                "rollout": rollout,
                "reconstructor": recon,
                "evaluator": evaluator,
            }
            metrics = {
                name: f"http://{_HOST}:{service.app.metrics_port}/metrics"
                for name, service in services.items()
                if service.app.metrics_port >= 0
            }
            yield cls(
                dashboard_url=f"{board.url}?token={dashboard_key}" if board is not None else "",
                dashboard=board,
                metrics=metrics,
                token=token,
                rollout_address=f"{_HOST}:{rollout.port}",
                gateway_address=f"{_HOST}:{ports['gateway']}",
                proxy_address=f"{_HOST}:{ports['proxy']}",
                reconstructor_address=f"{_HOST}:{ports['reconstructor']}",
                evaluator_address=f"{_HOST}:{ports['evaluator']}",
                options=options,
            )
