"""Settings of the RolloutService."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from polar_core.errors import InvalidArgument
from polar_core.gateway_tokens import GatewayTokenVerifier
from polar_core.settings import ServiceSettings

__all__ = ["RolloutSettings"]


class RolloutSettings(ServiceSettings):
    """Settings of the RolloutService; environment prefix ``POLAR_ROLLOUT_``, TOML table ``[rollout]``.

    Attributes:
        store_url: Where tasks and results live: empty for SQLite at ``state_dir/rollout.sqlite3``,
            ``sqlite:///PATH`` for another SQLite file, or ``postgresql://...`` for PostgreSQL (several hosts).
        gateway_addresses: Gateways to use without registration (``host:port``); their id and capacity are
            read with GetCapacity and refreshed every ``heartbeat_interval_s``.
        gateway_auth_token: Token sent to gateways, model proxies and trainer callbacks; empty means ``auth_token``.
        gateway_token_key_file: File holding the operator's signing key of per-gateway tokens
            (``polar token key``/``polar token issue``; ``docs/security.md``, "Gateway tokens"). When set, a
            gateway token (``polar-gw1.``...) grants the ``gateway`` role and binds its holder to the gateway id it
            names: RegisterGateway, Heartbeat, DrainGateway and ReportSessionResult for another id are refused
            with PERMISSION_DENIED; an expired, altered or foreign-key token with UNAUTHENTICATED saying why.
        require_gateway_tokens: Take gateway calls only with a gateway token: the shared ``gateway_token`` (and
            any other token that does not grant ``admin``) grants no ``gateway`` role here. Needs
            ``gateway_token_key_file`` and a control-plane token or mTLS for the other roles.
        heartbeat_interval_s: How often gateways should heartbeat.
        lease_ttl_s: How long a gateway registration lives without a heartbeat.
        dispatch_interval_s: Longest pause of the dispatch loop when nothing wakes it.
        dispatch_batch: Most sessions dispatched per loop turn.
        max_attempts: Attempts per session; only ``infra_error`` is retried, never a model failure.
        retry_backoff_s: Delay before the first retry of an ``infra_error`` session; doubles per retry.
        busy_backoff_s: Delay after RESOURCE_EXHAUSTED when the gateway gave no retry hint.
        session_grace_s: Slack on top of a task's ``timeout_seconds`` for runtime start and evaluation.
        task_timeout_s: Default limit for a whole task, from submission.
        max_active_tasks: Admission limit: SubmitTask answers RESOURCE_EXHAUSTED beyond it.
        gateway_rpc_timeout_s: Deadline of each call to a gateway.
        callback_max_attempts: Default delivery attempts before a result is dead-lettered.
        callback_backoff_s: Delay before the second delivery attempt; doubles per attempt.
        callback_backoff_max_s: Upper bound of the delivery backoff.
        callback_timeout_s: Deadline of each delivery call.
        watchdog_interval_s: How often deadlines, leases and lost sessions are checked.
        policy_drain_timeout_s: How long a proxy drains its calls in flight during UpdatePolicy when the request
            gives no ``drain_timeout``.
        proxy_rpc_timeout_s: Deadline of each short call to a model proxy (CheckWeights, ResumeGeneration, ...).
        policy_load_timeout_s: Deadline of each LoadWeights call to a model proxy.
        default_max_policy_lag: The staleness bound of a task that sets no ``max_policy_lag``; ``None`` means
            no bound (see ``docs/rollout.md``, "Staleness").
        default_stale_policy: What a task that names no ``stale_policy`` does with a session beyond its bound:
            ``keep`` it with its lag, or ``resample`` it.
        task_roots: Host directories a submitted task's repository and test-patch paths (``metadata.repo``,
            ``evaluator.repo``, ``evaluator.repo_path``, ``evaluator.test_patch``) must lie under, after
            symlinks; anything else is INVALID_ARGUMENT at SubmitTask, nothing recorded. Empty means the working
            directory at start. Keep it equal to the gateways' and evaluators' ``task_roots``.
        runtime_network: The most network a task's runtime may ask for: the gateways' ``runtime_network``.
        min_isolation: The weakest isolation a task may ask for: the gateways' ``min_isolation``.
        read_only_roots: Where a task's ``runtime.read_only_paths`` may lie: the gateways' ``read_only_roots``.
        allowed_images: Glob patterns of images a task may name: the gateways' ``allowed_images``.
        dashboard_address: ``host:port`` of the live dashboard's HTTP server (port 0 picks one); empty (the
            default) serves none. It shows tasks, sessions and results to holders of the trainer or admin token
            (or the all-roles ``auth_token``); see ``docs/observability.md``, "Dashboard".
        dashboard_key: An extra secret that opens the dashboard only (never the gRPC API); ``polar run`` makes
            one per run, so the link it prints gives away no control-plane token.
        dashboard_jaeger_url: Jaeger's UI (``http://jaeger:16686``); when set the dashboard links each task's
            sessions to their trace there.
        dashboard_proxy_metrics_urls: Prometheus endpoints of the model proxies (``http://proxy:9464/metrics``)
            the dashboard reads call latency and tokens/s from, while someone watches it.
        dashboard_proxy_metrics_token: The bearer token those endpoints require (their ``metrics_token``); empty:
            none.
        dashboard_tls_cert_file: PEM certificate (chain) the dashboard serves HTTPS with; with the key below. Unset:
            plain HTTP (and a warning on the page and in the log when it listens beyond loopback).
        dashboard_tls_key_file: PEM private key of ``dashboard_tls_cert_file``.
        metrics_refresh_s: Seconds between the counts behind the metrics endpoint's gauges (tasks, sessions and
            deliveries by state, gateways, policy version); each refresh is a few ``GROUP BY`` queries.
    """

    model_config = SettingsConfigDict(env_prefix="POLAR_ROLLOUT_", frozen=True, extra="forbid")
    toml_table: ClassVar[str] = "rollout"

    store_url: str = ""
    gateway_addresses: list[str] = Field(default_factory=list)
    gateway_auth_token: str = ""
    gateway_token_key_file: Path | None = None
    require_gateway_tokens: bool = False
    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    lease_ttl_s: float = Field(default=20.0, gt=0)
    dispatch_interval_s: float = Field(default=0.5, gt=0)
    dispatch_batch: int = Field(default=256, ge=1)
    max_attempts: int = Field(default=3, ge=1)
    retry_backoff_s: float = Field(default=1.0, ge=0)
    busy_backoff_s: float = Field(default=1.0, ge=0)
    session_grace_s: float = Field(default=300.0, ge=0)
    task_timeout_s: float = Field(default=6 * 3600.0, gt=0)
    max_active_tasks: int = Field(default=10_000, ge=1)
    gateway_rpc_timeout_s: float = Field(default=10.0, gt=0)
    callback_max_attempts: int = Field(default=8, ge=1)
    callback_backoff_s: float = Field(default=0.5, ge=0)
    callback_backoff_max_s: float = Field(default=60.0, ge=0)
    callback_timeout_s: float = Field(default=10.0, gt=0)
    watchdog_interval_s: float = Field(default=1.0, gt=0)
    policy_drain_timeout_s: float = Field(default=60.0, gt=0)
    proxy_rpc_timeout_s: float = Field(default=10.0, gt=0)
    policy_load_timeout_s: float = Field(default=600.0, gt=0)
    default_max_policy_lag: int | None = Field(default=None, ge=0)
    default_stale_policy: Literal["keep", "resample"] = "keep"
    task_roots: list[str] = Field(default_factory=list)
    runtime_network: Literal["host", "none", "proxy"] = "proxy"
    min_isolation: Literal["gvisor", "bwrap", "unshare", "none"] = "bwrap"
    read_only_roots: list[str] = Field(default_factory=list)
    allowed_images: list[str] = Field(default_factory=list)
    dashboard_address: str = ""
    dashboard_key: str = ""
    dashboard_jaeger_url: str = ""
    dashboard_proxy_metrics_urls: list[str] = Field(default_factory=list)
    dashboard_proxy_metrics_token: str = ""
    dashboard_tls_cert_file: Path | None = None
    dashboard_tls_key_file: Path | None = None
    metrics_refresh_s: float = Field(default=5.0, gt=0)

    def gateway_token_verifier(self) -> GatewayTokenVerifier | None:
        """The verifier of per-gateway tokens (``None`` without ``gateway_token_key_file``).

        Raises:
            InvalidArgument: The key file is unreadable or too short; or ``require_gateway_tokens`` is set without
                a key file, or on a server that authenticates nobody (no token, no mTLS), where it would hold
                nobody to anything.
        """
        if self.gateway_token_key_file is None:
            if self.require_gateway_tokens:
                raise InvalidArgument(
                    "require_gateway_tokens needs gateway_token_key_file (POLAR_ROLLOUT_GATEWAY_TOKEN_KEY_FILE): "
                    "the key gateway tokens are verified with"
                )
            return None
        if self.require_gateway_tokens and not self.accepted_tokens() and self.tls() is None:
            raise InvalidArgument(
                "require_gateway_tokens needs a control-plane token (trainer, internal, admin) or mTLS: a server "
                "that takes calls without one cannot require gateway tokens"
            )
        return GatewayTokenVerifier.from_file(self.gateway_token_key_file, required=self.require_gateway_tokens)
