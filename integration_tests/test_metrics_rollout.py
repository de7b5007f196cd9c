"""The rollout server's Prometheus endpoint over real gRPC: one task through a (fake, real-gRPC) gateway, a scrape."""

from __future__ import annotations

import asyncio
from pathlib import Path

from polar.common.v1 import session_pb2, task_pb2

from integration_tests.support.prometheus import scrape
from integration_tests.support.services import free_port
from polar_client import RolloutClient
from rollout_server.metrics import ROLLOUT_METRICS
from rollout_server.models import DeliveryState, SessionState, TaskState
from rollout_server.server import start_server
from rollout_server.settings import RolloutSettings
from rollout_server.testing.fake_gateway import FakeGateway

TOKEN = "metrics-token"


def _first_resolves(spec: session_pb2.SessionSpec) -> tuple[str, float]:
    return ("resolved", 1.0) if spec.sample_index == 0 else ("unresolved", 0.0)


async def test_a_task_shows_in_states_results_dispatch_and_dead_letters(tmp_path: Path, store_url: str) -> None:
    """Four sessions (one resolved), callbacks to nobody: the scrape counts each and names the gateway (SQLite
    and PostgreSQL: the gauges' counts are the store's ``GROUP BY`` queries)."""
    settings = RolloutSettings(
        state_dir=tmp_path, store_url=store_url, auth_token=TOKEN, dispatch_interval_s=0.05, watchdog_interval_s=0.1,
        callback_backoff_s=0.01, metrics_port=0, metrics_refresh_s=0.05,
    )  # fmt: skip
    running = await start_server(settings)
    target = f"127.0.0.1:{running.port}"
    gateway = await FakeGateway("g1", capacity=3, delay_s=0.01, rollout_target=target, token=TOKEN,
                                outcome=_first_resolves).start()  # fmt: skip
    try:
        await gateway.register(None)
        nobody = task_pb2.CallbackSpec(grpc_target=f"127.0.0.1:{free_port()}", max_attempts=1)
        spec = task_pb2.Task(task_id="m", instruction="fix it", num_samples=4, timeout_seconds=60, callback=nobody)
        async with RolloutClient(target, token=TOKEN) as client:
            await client.submit(spec)
            for _ in range(600):
                if (await client.get("m", summary_only=True)).task.statistics.deliveries_dead_lettered == 4:
                    break
                await asyncio.sleep(0.05)
        await running.app.overview.refresh()
        got = await asyncio.to_thread(scrape, running.app.metrics_port)
    finally:
        await gateway.stop()
        await running.stop(None)
    assert got.value("polar_rollout_sessions_finished_total", status="resolved") == 1
    assert got.value("polar_rollout_sessions_finished_total", status="unresolved") == 3
    assert got.value("polar_rollout_session_reward_sum") == 1.0
    assert got.value("polar_rollout_session_reward_count") == 4
    assert got.value("polar_rollout_session_duration_seconds_count", status="unresolved") == 3
    assert got.value("polar_rollout_tasks", state="completed") == 1
    assert got.value("polar_rollout_sessions", state="done") == 4
    assert got.value("polar_rollout_deliveries", state="dead") == 4
    assert got.value("polar_rollout_delivery_attempts_total", outcome="dead_lettered") == 4
    assert got.value("polar_rollout_dispatch_duration_seconds_count") == 4
    assert got.value("polar_rollout_gateways", state="live") == 1
    assert got.value("polar_rollout_gateway_capacity", gateway="g1") == 3
    assert got.value("polar_rollout_gateway_free", gateway="g1") == 3
    assert got.has("polar_rollout_policy_version")
    assert not got.has("polar_rollout_session_retries_total")
    got.check_declared(ROLLOUT_METRICS)


async def test_every_state_is_exported_with_zero_before_anything_is_in_it(tmp_path: Path) -> None:
    """An idle server (nothing submitted, nothing dead-lettered) exports each known task, session and delivery
    state as 0 once its first overview is taken: a Grafana panel on ``deliveries{state="dead"}`` reads 0, never
    "No data"."""
    settings = RolloutSettings(state_dir=tmp_path, auth_token=TOKEN, metrics_port=0, metrics_refresh_s=60.0)
    running = await start_server(settings)
    try:
        await running.app.overview.refresh()
        got = await asyncio.to_thread(scrape, running.app.metrics_port)
    finally:
        await running.stop(None)
    for name, states in (
        ("polar_rollout_tasks", TaskState),
        ("polar_rollout_sessions", SessionState),
        ("polar_rollout_deliveries", DeliveryState),
    ):
        for state in states:
            assert got.has(name, state=state.value), f"{name}{{state={state.value!r}}} is missing"
            assert got.value(name, state=state.value) == 0
    assert got.has("polar_rollout_gateways", state="expired")
