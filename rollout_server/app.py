"""Wiring of one rollout server process: store, domain core, scheduler, deliverer, policy coordinator, loops."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from opentelemetry.sdk.trace import TracerProvider

from polar_core.metrics import MetricsEndpoint, open_endpoint
from polar_core.roles import TOKEN_DIGEST_PREFIX, Role
from polar_core.version import polar_version
from rollout_server.clients import CallbackSenders, GrpcGatewayClient, GrpcProxyClient
from rollout_server.core import RolloutCore
from rollout_server.delivery import Deliverer
from rollout_server.metrics import RolloutMetrics
from rollout_server.models import CoreConfig, DeliveryConfig, PolicyConfig, SchedulerConfig, StalePolicy
from rollout_server.overview import OverviewLoop
from rollout_server.policy import PolicyCoordinator
from rollout_server.ports import CallbackSender, CurrentPolicyVersion, GatewayClient, ProxyClient
from rollout_server.scheduler import Scheduler
from rollout_server.settings import RolloutSettings
from rollout_server.staleness import StoreCurrentPolicyVersion
from rollout_server.store import Store, open_store
from rollout_server.task_check import TaskCheck

if TYPE_CHECKING:
    from rollout_server.dashboard import Dashboard

__all__ = ["RolloutApp"]


def _outgoing_tokens(settings: RolloutSettings) -> tuple[str, str]:
    """The tokens the rollout server presents: to gateways and proxies (``internal``), and to trainer callbacks.

    A callback goes wherever a trainer's task points it, so it never gets the internal token: with role tokens
    set it gets the trainer token (which the trainer knows anyway; none when only its digest is configured),
    and only a legacy setup (``auth_token``/``gateway_auth_token`` alone) sends that shared token.
    """
    if settings.internal_token or not settings.gateway_auth_token:
        internal = settings.presented_token(Role.INTERNAL)
    else:
        internal = settings.gateway_auth_token
    if not (settings.trainer_token or settings.gateway_token or settings.internal_token):
        return internal, internal
    trainer = settings.trainer_token
    return internal, "" if trainer.startswith(TOKEN_DIGEST_PREFIX) else trainer


class RolloutApp:
    """Everything behind the RolloutService, started and stopped together."""

    def __init__(
        self,
        store: Store,
        core: RolloutCore,
        scheduler: Scheduler,
        deliverer: Deliverer,
        closers: list[GatewayClient | CallbackSender | ProxyClient],
        policy: PolicyCoordinator | None = None,
        dashboard: Dashboard | None = None,
        *,
        overview: OverviewLoop,
        metrics_endpoint: MetricsEndpoint | None = None,
    ) -> None:
        self.store = store
        self.core = core
        self.scheduler = scheduler
        self.deliverer = deliverer
        self.policy = policy or PolicyCoordinator(store, GrpcProxyClient())
        self.dashboard = dashboard
        self._closers = closers
        self._loops: list[asyncio.Task[None]] = []
        self.metrics_endpoint = metrics_endpoint
        self.overview = overview
        """The latest counts by state, gateway load and policy version (the gauges' source, given to the core's
        metrics when :meth:`open` built them); refreshed in the background while the metrics endpoint is on, or on
        demand with ``overview.refresh()``."""

    @property
    def metrics_port(self) -> int:
        """Port of the Prometheus endpoint (-1 when off)."""
        return self.metrics_endpoint.port if self.metrics_endpoint is not None else -1

    @classmethod
    async def open(
        cls,
        settings: RolloutSettings,
        *,
        tracer_provider: TracerProvider | None = None,
        store: Store | None = None,
        gateway_client: GatewayClient | None = None,
        callback_sender: CallbackSender | None = None,
        proxy_client: ProxyClient | None = None,
        clock: Callable[[], float] = time.time,
        current_policy: CurrentPolicyVersion | None = None,
    ) -> RolloutApp:
        """Build the app from settings; ``store`` and the ``..._client``/``..._sender`` seams override the defaults.

        ``current_policy`` says the fleet's policy version for staleness; by default the fleet's current version
        (from UpdatePolicy), or the highest integer version recorded in results before any update.
        """
        dashboard: Dashboard | None = None
        if settings.dashboard_address:  # imported only when asked for: a server without one loads no aiohttp
            from rollout_server.dashboard import Dashboard

            Dashboard.check_settings(settings)  # before anything opens
        store = store or await open_store(settings.store_url, settings.state_dir)
        endpoint, meter_provider = open_endpoint(
            "polar-rollout", settings.metrics_host, settings.metrics_port, token=settings.metrics_token
        )
        # The fleet's policy version and the overview are built before the core and its metrics, which both
        # take them: nothing is wired into an object after it is made.
        policy_version = current_policy or StoreCurrentPolicyVersion(store)
        overview = OverviewLoop(store, policy_version, clock, interval_s=settings.metrics_refresh_s)
        metrics = RolloutMetrics(meter_provider, overview=lambda: overview.latest)
        token, callback_token = _outgoing_tokens(settings)
        gateways = gateway_client or GrpcGatewayClient(
            auth_token=token,
            timeout_s=settings.gateway_rpc_timeout_s,
            tracer_provider=tracer_provider,
            tls=settings.tls(),
            max_message_bytes=settings.max_message_bytes,
        )
        sender = callback_sender or CallbackSenders(
            auth_token=callback_token,
            timeout_s=settings.callback_timeout_s,
            tracer_provider=tracer_provider,
            max_message_bytes=settings.max_message_bytes,
            tls=settings.tls(),
        )
        core = RolloutCore(
            store,
            gateways,
            CoreConfig(
                max_attempts=settings.max_attempts,
                retry_backoff_s=settings.retry_backoff_s,
                session_grace_s=settings.session_grace_s,
                task_timeout_s=settings.task_timeout_s,
                max_active_tasks=settings.max_active_tasks,
                heartbeat_interval_s=settings.heartbeat_interval_s,
                lease_ttl_s=settings.lease_ttl_s,
                callback_max_attempts=settings.callback_max_attempts,
                default_max_policy_lag=settings.default_max_policy_lag,
                default_stale_policy=StalePolicy(settings.default_stale_policy),
                server_version=polar_version(),
            ),
            clock=clock,
            current_policy=policy_version,
            task_check=TaskCheck.from_settings(settings),
            metrics=metrics,
        )
        scheduler = Scheduler(
            core,
            SchedulerConfig(
                dispatch_interval_s=settings.dispatch_interval_s,
                dispatch_batch=settings.dispatch_batch,
                busy_backoff_s=settings.busy_backoff_s,
                watchdog_interval_s=settings.watchdog_interval_s,
                static_gateways=tuple(settings.gateway_addresses),
            ),
        )
        deliverer = Deliverer(
            store,
            sender,
            DeliveryConfig(
                max_attempts=settings.callback_max_attempts,
                backoff_s=settings.callback_backoff_s,
                backoff_max_s=settings.callback_backoff_max_s,
            ),
            clock=clock,
            wakeup=core.delivery_wakeup,
            metrics=metrics,
        )
        proxies = proxy_client or GrpcProxyClient(
            auth_token=token,
            timeout_s=settings.proxy_rpc_timeout_s,
            load_timeout_s=settings.policy_load_timeout_s,
            tracer_provider=tracer_provider,
            tls=settings.tls(),
            max_message_bytes=settings.max_message_bytes,
        )
        policy = PolicyCoordinator(
            store,
            proxies,
            PolicyConfig(drain_timeout_s=settings.policy_drain_timeout_s, server_version=polar_version()),
            clock=clock,
        )
        dashboard = Dashboard.from_settings(settings, store) if settings.dashboard_address else None
        return cls(
            store,
            core,
            scheduler,
            deliverer,
            [gateways, sender, proxies],
            policy,
            dashboard,
            overview=overview,
            metrics_endpoint=endpoint,
        )

    async def start(self) -> None:
        """Start the dashboard (if any), reconcile with gateways and the store, then start the loops."""
        if self.dashboard is not None:
            await self.dashboard.start()  # first: a taken port fails before any loop runs
        if self.scheduler.config.static_gateways:
            await self.scheduler.refresh_static_gateways(self.scheduler.config.static_gateways)
        await self.scheduler.reconcile()
        await self.core.recover()
        self._loops = [
            asyncio.create_task(self.scheduler.run_dispatch(), name="rollout-dispatch"),
            asyncio.create_task(self.scheduler.run_watchdog(), name="rollout-watchdog"),
            asyncio.create_task(self.deliverer.run(), name="rollout-delivery"),
        ]
        if self.metrics_endpoint is not None:
            self._loops.append(asyncio.create_task(self.overview.run(), name="rollout-overview"))

    async def close(self) -> None:
        """Stop the dashboard and the loops and release connections (idempotent)."""
        if self.dashboard is not None:
            await self.dashboard.stop()
        loops, self._loops = self._loops, []
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await self.scheduler.close()
        await self.policy.close()
        await self.core.close()
        closers, self._closers = self._closers, []
        for closer in closers:
            await closer.close()
        if closers:
            await self.store.close()
        endpoint, self.metrics_endpoint = self.metrics_endpoint, None
        if endpoint is not None:
            endpoint.stop()
