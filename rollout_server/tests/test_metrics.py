"""The rollout server's instruments over the real domain (SQLite, the in-memory fake gateway, a hand-driven clock):
results, retries, dispatch latency, deliveries, and the counts-only overview behind the gauges."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from polar_core.records import TerminalStatus
from polar_core.testing import MetricPoints
from rollout_server.core import RolloutCore
from rollout_server.delivery import Deliverer
from rollout_server.metrics import RolloutMetrics
from rollout_server.models import CallbackTarget, CoreConfig, DeliveryConfig, GatewayRecord, NewTask, SchedulerConfig
from rollout_server.overview import OverviewLoop
from rollout_server.scheduler import Scheduler
from rollout_server.store.sql import SqlStore
from rollout_server.store.sqlite import open_sqlite_store
from rollout_server.testing.fakes import FakeGatewayClient, ManualClock, RecordingSender, make_result


@dataclasses.dataclass
class Env:
    store: SqlStore
    core: RolloutCore
    scheduler: Scheduler
    gateways: FakeGatewayClient
    clock: ManualClock
    m: MetricPoints

    async def dispatch(self) -> None:
        await self.scheduler.dispatch_once()
        await self.scheduler.wait_for_starts()

    async def finish(self, status: TerminalStatus, reward: float) -> None:
        for address, held in list(self.gateways.sessions.items()):
            for sid, s in list(held.items()):
                if not (s.done or s.cancelled):
                    result = make_result(s.dispatch, gateway_id=address.removeprefix("addr-"), status=status,
                                         reward=reward, policy_versions=["3"])  # fmt: skip
                    self.gateways.finish(address, sid, result)
                    await self.core.report_result(dataclasses.replace(result))
        while self.core._background:
            await next(iter(self.core._background))


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    clock = ManualClock()
    store = await open_sqlite_store(tmp_path / "r.sqlite3")
    m = MetricPoints()
    fake = FakeGatewayClient()
    core = RolloutCore(store, fake, CoreConfig(retry_backoff_s=1.0), clock=clock, metrics=RolloutMetrics(m.provider))
    scheduler = Scheduler(core, SchedulerConfig())
    yield Env(store, core, scheduler, fake, clock, m)
    await core.close()
    await store.close()


def _task(task_id: str, n: int, **kw: object) -> NewTask:
    return NewTask(task_id=task_id, spec=b"spec", spec_hash=f"h-{task_id}", num_samples=n, **kw)  # type: ignore[arg-type]


async def test_results_retries_and_dispatch_latency_are_recorded(env: Env) -> None:
    await env.core.register_gateway(GatewayRecord("a", "addr-a", 4))
    await env.core.submit_task(_task("t", 2))
    env.clock.now += 5.0  # the sessions waited 5 s for a gateway
    await env.dispatch()
    await env.finish(TerminalStatus.INFRA_ERROR, 0.0)  # both retried (attempts remain)
    assert env.m.value("polar.rollout.session.retries", reason="infra_error") == 2
    assert not env.m.points("polar.rollout.sessions.finished")
    env.clock.now += 10.0
    await env.dispatch()
    await env.finish(TerminalStatus.RESOLVED, 0.75)
    assert env.m.value("polar.rollout.sessions.finished", status="resolved") == 2
    assert env.m.value("polar.rollout.session.reward", status="resolved") == 1.5
    assert env.m.count("polar.rollout.session.duration", status="resolved") == 2
    assert env.m.count("polar.rollout.session.policy_lag") == 2
    assert env.m.count("polar.rollout.dispatch.duration") == 4
    # First attempts waited 5 s since submission; retries waited since their backoff ended (10 - 1 s).
    assert env.m.value("polar.rollout.dispatch.duration") == pytest.approx(2 * 5.0 + 2 * 9.0)


async def test_a_busy_gateway_counts_a_retry(env: Env) -> None:
    await env.core.register_gateway(GatewayRecord("a", "addr-a", 4))
    env.gateways.busy["addr-a"] = None
    await env.core.submit_task(_task("t", 1))
    await env.dispatch()
    assert env.m.value("polar.rollout.session.retries", reason="gateway_busy") == 1


async def test_deliveries_and_dead_letters_are_counted(env: Env) -> None:
    await env.core.register_gateway(GatewayRecord("a", "addr-a", 4))
    await env.core.submit_task(_task("ok", 1, callback=CallbackTarget("grpc", "trainer:1")))
    await env.core.submit_task(_task("dead", 1, callback=CallbackTarget("grpc", "trainer:2", max_attempts=1)))
    await env.dispatch()
    await env.finish(TerminalStatus.RESOLVED, 1.0)
    sender = RecordingSender(failures=1)
    metrics = env.core.metrics
    deliverer = Deliverer(env.store, sender, DeliveryConfig(max_attempts=3, backoff_s=1.0), clock=env.clock,
                          wakeup=env.core.delivery_wakeup, metrics=metrics)  # fmt: skip
    await deliverer.deliver_once()
    assert env.m.value("polar.rollout.delivery.attempts", outcome="retry") == 1
    assert env.m.value("polar.rollout.delivery.attempts", outcome="dead_lettered") == 1
    env.clock.now += 4.0
    await deliverer.deliver_once()
    assert env.m.value("polar.rollout.delivery.attempts", outcome="delivered") == 1
    assert env.m.value("polar.rollout.delivery.lag") == pytest.approx(4.0)


async def test_the_overview_counts_states_gateways_and_the_policy_version(env: Env) -> None:
    await env.core.register_gateway(GatewayRecord("a", "addr-a", 3))
    await env.core.register_gateway(GatewayRecord("b", "addr-b", 2))
    await env.core.drain_gateway("b")
    await env.core.submit_task(_task("t", 4))
    await env.dispatch()
    loop = OverviewLoop(env.store, env.core.current_policy, env.clock, interval_s=1.0)
    env.core.metrics.overview = lambda: loop.latest
    assert not env.m.points("polar.rollout.sessions")  # nothing is read before the first refresh
    overview = await loop.refresh()
    assert overview.taken_at == env.clock.now
    assert env.m.value("polar.rollout.tasks", state="running") == 1
    assert env.m.value("polar.rollout.sessions", state="running") == 3
    assert env.m.value("polar.rollout.sessions", state="pending") == 1
    assert env.m.value("polar.rollout.gateways", state="live") == 1
    assert env.m.value("polar.rollout.gateways", state="draining") == 1
    assert env.m.value("polar.rollout.gateway.capacity", gateway="a") == 3
    assert env.m.value("polar.rollout.gateway.free", gateway="a") == 0
    assert env.m.value("polar.rollout.gateway.free", gateway="b") == 0  # draining: no free slot
    assert env.m.value("polar.rollout.policy.version") == 0
