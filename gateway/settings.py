"""Settings of the GatewayService."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from polar_core.settings import ServiceSettings

__all__ = ["GatewaySettings"]


class GatewaySettings(ServiceSettings):
    """Settings of the GatewayService; environment prefix ``POLAR_GATEWAY_``, TOML table ``[gateway]``.

    Attributes:
        gateway_id: This gateway's id in session states and results; empty means ``gateway-<port>``.
        max_sessions: Sessions accepted at once (all stages together); StartSession answers
            RESOURCE_EXHAUSTED beyond it.
        init_workers: Sessions prepared at once (runtime creation, harness preparation).
        ready_capacity: Prepared runtimes that may wait for a RUNNING slot; a prepared session waits in INIT
            (holding its worker) while the buffer is full.
        running_workers: Harnesses run at once (the scarce slots).
        postrun_workers: Sessions collected, evaluated, reconstructed and reported at once.
        postrun_backlog_limit: When more sessions than this wait for a POSTRUN worker, StartSession answers
            RESOURCE_EXHAUSTED with a retry delay, so backpressure reaches admission.
        session_timeout_s: Default session budget from INIT, used when a spec carries no deadline.
        agent_timeout_s: Default agent budget from RUN, used when a task's ``timeout_seconds`` is 0.
        eval_timeout_s: Default evaluation time limit.
        step_timeout_s: Limit on each short side effect (open or close a proxy session, list completions,
            reconstruct, report, release).
        runtime_start_timeout_s: Limit on creating and starting a runtime.
        teardown_timeout_s: Limit on tearing a runtime down.
        step_retries: Extra attempts of an idempotent step that failed with UNAVAILABLE.
        retained_results: Finished sessions kept for GetSession and WatchSessions before the oldest go.
        retained_traces: Finished sessions whose results keep their traces for GetSession (the most recent);
            older retained results keep every other field. The rollout server has them once reported, and a
            long session's traces are megabytes, so the gateway's memory stays bounded by what is in flight.
        watch_buffer: Events buffered per watcher; a watcher that falls further behind is disconnected.
        proxy_address: gRPC target of the ModelProxyService; empty means none (embedded wiring injects one).
        reconstructor_address: gRPC target of the ReconstructorService.
        evaluator_address: gRPC target of the EvaluatorService.
        rollout_address: gRPC target of the RolloutService: the gateway registers there at start, heartbeats
            with its capacity and stage load, and reports results (ReportSessionResult); empty keeps results
            only for GetSession and WatchSessions.
        advertise_address: ``host:port`` the rollout server reaches this gateway at; empty means ``host:port``
            of the gRPC server (the machine's host name when it binds every interface).
        default_runtime: Runtime kind used when a task leaves it unspecified.
        runtime_network: Network of runtimes, and the most a task may ask for (a task may narrow it): ``proxy``
            (loopback only, plus the model proxy through the gateway's Unix-socket tunnel; nothing else is
            reachable), ``host`` (the host's network: harnesses reach the proxy, and everything else, directly) or
            ``none``.
        min_isolation: The weakest local-runtime isolation allowed (``bwrap``; ``unshare`` or ``none`` only when
            set explicitly, and then every session logs a WARNING). Probed once at start: a host that cannot
            provide it refuses every session with FAILED_PRECONDITION naming what is missing and advertises no
            capacity. A task may ask for stronger isolation, never weaker (docs/runtimes.md).
        task_roots: Host directories under which a task's repository and test-patch paths (``metadata.repo``,
            ``evaluator.repo``, ``evaluator.repo_path``, ``evaluator.test_patch``) must resolve, after symlinks;
            anything else is INVALID_ARGUMENT. Empty means the working directory at start.
        read_only_roots: Host directories under which a task may add ``runtime.read_only_paths`` (besides the
            gateway's own read-only paths); empty allows none.
        allowed_images: Glob patterns of container images a task may name (``runtime.image``); empty allows none.
        docker_host: Docker daemon URL of ``docker`` runtimes; empty uses the Docker SDK's defaults.
        sandbox_proxy_port: Loopback port inside ``proxy``-network runtimes where the tunnel reaches the proxy.
        tunnel_dir: Directory of the tunnel's Unix socket; empty means ``state_dir/tunnel`` (or a private
            ``/tmp`` directory when that path is too long for a socket).
        harness_bin_dir: Directory (as runtimes see it) holding installed harness CLIs; prepended to ``PATH``.
            Empty means the ``.harnesses/node_modules/.bin`` that ``scripts/setup_harnesses.sh`` installs, in
            the working directory or the checkout, when there is one (as ``polar run`` finds it).
        dependency_probes: Whether to probe proxy, evaluator and reconstructor; while one is unreachable the
            gateway advertises no capacity. Off for an embedded stack, whose services share the gateway's
            process (a busy event loop would look like an outage, and nothing there can be unreachable).
        dependency_probe_interval_s: Seconds between health probes.
        default_model: Model name the harness asks for when neither harness nor backend options name one.
        workspace_dir: Workspace directory (relative to the runtime's session directory) the agent works in.
        metrics_port: Port of the Prometheus ``/metrics`` endpoint; 0 picks a free one, -1 disables it.
        metrics_host: Interface the metrics endpoint binds.
        result_patch_limit_bytes: Most bytes of the agent's patch kept on a session result (``patch_truncated``
            says when it was cut; the evaluator always gets the whole patch).
        drain_timeout_s: How long a gateway told to drain before exiting (``polar serve`` on SIGUSR1) lets its
            running sessions finish; what still runs then is handed back to the rollout server as an outage.
        identity_token: This gateway's own gateway token (``polar token issue --gateway-id ID``,
            ``POLAR_GATEWAY_IDENTITY_TOKEN``), presented to the rollout server instead of the shared
            ``gateway_token`` (which the proxy, reconstructor and evaluator still get). It names the gateway id:
            an empty ``gateway_id`` takes it, a different one refuses to start, and so does an expired token.
        result_log_limit_bytes: Most bytes of each of the harness's stdout and stderr kept (their tails) on a
            session result.
    """

    model_config = SettingsConfigDict(env_prefix="POLAR_GATEWAY_", frozen=True, extra="forbid")
    toml_table: ClassVar[str] = "gateway"

    gateway_id: str = ""
    max_sessions: int = Field(default=64, ge=1)
    init_workers: int = Field(default=4, ge=1)
    ready_capacity: int = Field(default=4, ge=1)
    running_workers: int = Field(default=8, ge=1)
    postrun_workers: int = Field(default=4, ge=1)
    postrun_backlog_limit: int = Field(default=16, ge=0)
    session_timeout_s: float = Field(default=1800.0, gt=0)
    agent_timeout_s: float = Field(default=600.0, gt=0)
    eval_timeout_s: float = Field(default=600.0, gt=0)
    step_timeout_s: float = Field(default=60.0, gt=0)
    runtime_start_timeout_s: float = Field(default=300.0, gt=0)
    teardown_timeout_s: float = Field(default=60.0, gt=0)
    step_retries: int = Field(default=2, ge=0)
    retained_results: int = Field(default=10_000, ge=1)
    retained_traces: int = Field(default=16, ge=1)
    watch_buffer: int = Field(default=1024, ge=1)
    proxy_address: str = ""
    reconstructor_address: str = ""
    evaluator_address: str = ""
    rollout_address: str = ""
    advertise_address: str = ""
    default_runtime: Literal["local", "docker", "apptainer"] = "local"
    runtime_network: Literal["host", "none", "proxy"] = "proxy"
    min_isolation: Literal["gvisor", "bwrap", "unshare", "none"] = "bwrap"
    task_roots: list[str] = Field(default_factory=list)
    read_only_roots: list[str] = Field(default_factory=list)
    allowed_images: list[str] = Field(default_factory=list)
    docker_host: str = ""
    sandbox_proxy_port: int = Field(default=18080, ge=1, le=65535)
    tunnel_dir: str = ""
    harness_bin_dir: str = ""
    dependency_probes: bool = True
    dependency_probe_interval_s: float = Field(default=1.0, gt=0)
    default_model: str = "policy"
    workspace_dir: str = "workspace"
    metrics_port: int = Field(default=0, ge=-1, le=65535)
    metrics_host: str = "127.0.0.1"
    result_patch_limit_bytes: int = Field(default=1 << 20, ge=0)
    result_log_limit_bytes: int = Field(default=64 << 10, ge=0)
    drain_timeout_s: float = Field(default=60.0, ge=0)
    identity_token: str = ""
