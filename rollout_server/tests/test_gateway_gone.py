"""A gateway that leaves the pool (its lease lapsed and it is unreachable) costs its sessions no attempt.

Its node died or its job was cancelled: the watchdog runs each of its sessions again elsewhere as an outage
(``dependency_unavailable``), not as the session's ``infra_error``. A gateway that still heartbeats but does not
answer is an ordinary failure.
"""

from __future__ import annotations

from pathlib import Path

from rollout_server.models import SessionState
from rollout_server.tests.test_core import make_env, new_task, settle


async def test_sessions_of_a_gateway_whose_lease_lapsed_are_retried_without_using_an_attempt(tmp_path: Path) -> None:
    env = await make_env(tmp_path / "r.sqlite3", lease_ttl_s=5.0)
    try:
        await env.add_gateway("a", 2)
        await env.core.submit_task(new_task("t", 2))
        assert await env.dispatch() == 2
        env.gateways.unreachable.add("addr-a")  # its node died
        env.clock.now += 6  # past the lease
        await env.add_gateway("b", 2)
        # Four losses (more than max_attempts=3): each on a gateway that then left the pool.
        for gateway in ("b", "c", "d", "e"):
            await env.scheduler.watchdog_once()
            await settle(env.core)
            sessions = await env.store.task_sessions("t")
            assert all(s.state is SessionState.PENDING for s in sessions), sessions
            assert all(s.infra_failures == 0 for s in sessions), sessions
            env.clock.now += 60  # past the retry backoff
            await env.add_gateway(gateway, 2)
            assert await env.dispatch() == 2
            env.gateways.unreachable.add(f"addr-{gateway}")
            env.clock.now += 6
        sessions = await env.store.task_sessions("t")
        assert [(s.outages, s.infra_failures, s.attempt) for s in sessions] == [(4, 0, 5)] * 2
        await env.scheduler.watchdog_once()  # the fifth loss
        await settle(env.core)
        env.clock.now += 60
        await env.add_gateway("f", 2)
        assert await env.dispatch() == 2
        env.gateways.unreachable.add("addr-f")  # heartbeats (a fresh lease) but does not answer: a failure
        await env.scheduler.reconcile()
        await settle(env.core)
        sessions = await env.store.task_sessions("t")
        assert [(s.state, s.outages, s.infra_failures) for s in sessions] == [(SessionState.PENDING, 5, 1)] * 2
    finally:
        await env.core.close()
        await env.store.close()
