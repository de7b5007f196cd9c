"""Unit tests of the dashboard's data side, auth and proxy figures: a SQLite store in a temporary file, no ports."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from polar_core.errors import InvalidArgument
from polar_core.records import TerminalStatus
from rollout_server.core import RolloutCore
from rollout_server.dashboard import (
    Dashboard,
    DashboardAuth,
    DashboardData,
    DataConfig,
    ProxyMetricsSource,
    SnapshotHub,
    jaeger_trace_url,
    parse_address,
)
from rollout_server.dashboard.data import sessions_by_stage
from rollout_server.dashboard.hub import HISTORY_POINTS, event_body
from rollout_server.dashboard.proxy_metrics import quantile
from rollout_server.models import GatewayRecord, NewTask, SchedulerConfig
from rollout_server.scheduler import Scheduler
from rollout_server.settings import RolloutSettings
from rollout_server.store.sql import SqlStore
from rollout_server.store.sqlite import open_sqlite_store
from rollout_server.testing.fakes import FakeGatewayClient, ManualClock, make_result

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@dataclasses.dataclass
class Env:
    store: SqlStore
    core: RolloutCore
    scheduler: Scheduler
    gateways: FakeGatewayClient
    clock: ManualClock
    data: DashboardData


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    clock = ManualClock()
    store = await open_sqlite_store(tmp_path / "r.sqlite3")
    fake = FakeGatewayClient()
    core = RolloutCore(store, fake, clock=clock)
    scheduler = Scheduler(core, SchedulerConfig())
    data = DashboardData(store, DataConfig(jaeger_url="http://jaeger:16686/", rows=3), clock=clock)
    yield Env(store, core, scheduler, fake, clock, data)
    await core.close()
    await store.close()


async def _run_task(env: Env, task_id: str, outcomes: list[tuple[TerminalStatus, float, str]]) -> None:
    """Submit a task of len(outcomes) sessions, dispatch them all, and finish each with its outcome."""
    await env.core.submit_task(NewTask(task_id, b"spec", f"h-{task_id}", len(outcomes)))
    await env.scheduler.dispatch_once()
    await env.scheduler.wait_for_starts()
    held = env.gateways.sessions["addr-g"]
    for i, (status, reward, error) in enumerate(outcomes):
        env.clock.now += 1.0
        session = held[f"{task_id}-{i:04d}"]
        result = make_result(session.dispatch, gateway_id="g", status=status, reward=reward)
        result.error_message = error
        result.duration_s = 10.0 + i
        await env.core.report_result(result)


async def test_snapshot_counts_states_rewards_statuses_and_failures(env: Env) -> None:
    await env.core.register_gateway(GatewayRecord("g", "addr-g", 8, stage_metrics={"running": {"occupancy": 2}}))
    await _run_task(
        env,
        "t1",
        [
            (TerminalStatus.RESOLVED, 1.0, ""),
            (TerminalStatus.UNRESOLVED, 0.0, ""),
            (TerminalStatus.INFRA_ERROR, 0.0, "<img src=x onerror=alert(1)> sandbox died"),
        ],
    )
    await env.core.submit_task(NewTask("t2", b"spec", "h-t2", 2))
    snap = await env.data.snapshot()
    rows = {t["task_id"]: t for t in snap["tasks"]}
    assert set(rows) == {"t1", "t2"}
    assert rows["t2"]["sessions"] == {"pending": 2, "starting": 0, "running": 0, "done": 0}
    # The infra_error is retried (attempts left), so two of t1's three sessions are done.
    assert rows["t1"]["sessions"]["done"] == 2
    assert [p[:2] for p in rows["t1"]["rewards"]] == [[0, 1.0], [1, 0.0]]
    assert snap["statuses"] == {"resolved": 1, "unresolved": 1}
    assert snap["sessions_by_state"]["pending"] == 3  # t2's two and t1's retry
    assert snap["gateways"][0]["stages"] == {"running": {"occupancy": 2}}
    assert sum(rate for _, rate in snap["completions"]) * env.data.config.rate_bucket_s == 2
    assert [r["session_id"] for r in snap["recent"]] == ["t1-0001", "t1-0000"]
    assert snap["failing"] == []  # the retried attempt is not a final result
    assert snap["policy"]["version"] == 0


async def test_tiles_use_the_gateways_stage_vocabulary_running_is_not_evaluation(env: Env) -> None:
    """Five sessions at the gateway (the store's ``running``): the gateway reports two agents running, one
    session evaluating and one waiting for POSTRUN, one being prepared. The tiles say running 2 and postrun 2
    (evaluation is not "running"), the prepared one counts as starting, and the five add up to the task."""
    stages = {
        "init": {"occupancy": 1, "queue_length": 0},
        "ready": {"occupancy": 0, "queue_length": 1},  # waiting for READY while holding its INIT slot
        "running": {"occupancy": 2, "queue_length": 0},
        "postrun": {"occupancy": 1, "queue_length": 1},
    }
    await env.core.register_gateway(GatewayRecord("g", "addr-g", 8, stage_metrics=stages))
    await env.core.submit_task(NewTask("t", b"spec", "h-t", 6))
    await env.scheduler.dispatch_once()
    await env.scheduler.wait_for_starts()
    snap = await env.data.snapshot()
    assert snap["sessions_by_state"] == {"pending": 0, "starting": 0, "running": 6, "done": 0}
    assert snap["sessions_by_stage"] == {"pending": 0, "starting": 2, "running": 2, "postrun": 2, "done": 0}
    assert {row["state"] for row in snap["slowest"]} == {"in flight"}  # not "running": some are in postrun
    # Heartbeats lag the store: a gateway claiming more than the store holds never makes the tiles overcount.
    crowded = {"running": {"occupancy": 5}, "postrun": {"occupancy": 4}}
    live = GatewayRecord("g", "a", 8, stage_metrics=crowded, lease_expires_at=env.clock.now)
    split = sessions_by_stage(snap["sessions_by_state"], [live], env.clock.now)
    assert split == {"pending": 0, "starting": 0, "running": 5, "postrun": 1, "done": 0}
    # An expired gateway's report is not counted: its sessions show as starting (at a gateway, stage unknown).
    expired = GatewayRecord("g", "a", 8, stage_metrics=crowded, lease_expires_at=env.clock.now - 1)
    assert sessions_by_stage(snap["sessions_by_state"], [expired], env.clock.now)["starting"] == 6


async def test_failing_and_slowest_sessions_carry_error_and_trace_link(env: Env) -> None:
    await env.core.register_gateway(GatewayRecord("g", "addr-g", 8))
    await _run_task(
        env, "t1", [(TerminalStatus.AGENT_TIMEOUT, 0.0, "agent ran out of time"), (TerminalStatus.RESOLVED, 1.0, "")]
    )
    task = await env.store.get_task("t1")
    assert task is not None
    snap = await env.data.snapshot()
    assert [f["error"] for f in snap["failing"]] == ["agent ran out of time"]
    assert snap["slowest"][0]["session_id"] == "t1-0001"  # 11 s beats 10 s
    task.trace_context = {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"}
    assert jaeger_trace_url("http://jaeger:16686/", task) == f"http://jaeger:16686/trace/{TRACE_ID}"
    assert jaeger_trace_url("", task) == ""
    task.trace_context = {"traceparent": "00-../../evil-00f067aa0ba902b7-01"}
    assert jaeger_trace_url("http://jaeger:16686", task) == ""


def test_auth_accepts_tokens_digests_and_sessions_only() -> None:
    import hashlib

    digest = "sha256:" + hashlib.sha256(b"admin-secret").hexdigest()
    auth = DashboardAuth(["Trainer-Secret", digest.upper().replace("SHA256:", "sha256:"), ""])
    assert not auth.open_access
    assert auth.check_secret("Trainer-Secret")
    assert not auth.check_secret("trainer-secret")  # secrets are case-sensitive; only hex digests are not
    assert auth.check_secret("admin-secret")
    assert not auth.check_secret(digest)  # a digest verifies; it is not itself a secret
    assert not auth.check_secret("")
    assert not auth.allowed(cookie="", authorization="")
    assert not auth.allowed(cookie="made-up", authorization="Bearer wrong")
    assert auth.allowed(cookie="", authorization="Bearer Trainer-Secret")
    sid = auth.open_session()
    assert auth.allowed(cookie=sid, authorization="")
    auth.close_session(sid)
    assert not auth.allowed(cookie=sid, authorization="")
    assert DashboardAuth([]).open_access


def test_settings_refuse_an_open_dashboard_off_loopback_and_bad_addresses() -> None:
    Dashboard.check_settings(RolloutSettings(dashboard_address="127.0.0.1:0"))
    Dashboard.check_settings(RolloutSettings(dashboard_address="0.0.0.0:8080", trainer_token="t"))
    Dashboard.check_settings(RolloutSettings(dashboard_address="0.0.0.0:8080", insecure=True))
    with pytest.raises(InvalidArgument, match="refusing to serve the dashboard"):
        Dashboard.check_settings(RolloutSettings(dashboard_address="0.0.0.0:8080"))
    # Gateway and internal tokens do not open the dashboard, so they do not make it private either.
    with pytest.raises(InvalidArgument, match="refusing"):
        Dashboard.check_settings(RolloutSettings(dashboard_address="10.0.0.5:80", gateway_token="g"))
    for bad in ("8080", "host:", "host:99999", ":80"):
        with pytest.raises(InvalidArgument, match="dashboard_address"):
            parse_address(bad)
    assert parse_address("[::1]:0") == ("::1", 0)


def _histogram(name: str, buckets: dict[str, int], tokens: int) -> str:
    lines = [f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{le="{le}",gen_ai_operation_name="chat"}} {n}' for le, n in buckets.items()]
    lines += [f"{name}_count {list(buckets.values())[-1]}", f"{name}_sum 1"]
    lines += ["# TYPE gen_ai_server_output_tokens_total counter", f"gen_ai_server_output_tokens_total {tokens}"]
    return "\n".join(lines) + "\n"


def test_proxy_figures_from_two_reads_of_prometheus_text() -> None:
    source = ProxyMetricsSource(["http://proxy/metrics"])
    name = "gen_ai_server_request_duration_seconds"
    first = source.parse_for_test([_histogram(name, {"0.5": 0, "1.0": 10, "+Inf": 10}, 100)], at=10.0)
    figures = source.figures(first, [])
    assert figures["latency_s"]["p50"] == pytest.approx(0.75)  # half-way through the 0.5-1.0 bucket
    assert figures["tokens_per_s"] is None  # a rate needs two reads
    assert figures["ttft_s"] is None
    # Two proxies, the second read 2 s later: the window has not moved past the first read, so it reaches back to
    # the start and the first read's slower calls count too.
    second = source.parse_for_test(
        [
            _histogram(name, {"0.5": 6, "1.0": 16, "+Inf": 16}, 300),
            _histogram(name, {"0.5": 0, "1.0": 0, "+Inf": 0}, 0),
        ],
        at=12.0,
    )
    figures = source.figures(second, [])
    assert figures["latency_s"]["p50"] == pytest.approx(0.5 + 0.5 * 2 / 10)  # 16 calls: 6 fast, 10 slower
    assert figures["tokens_per_s"] == pytest.approx(100.0)
    assert figures["window_s"] == 60.0


def test_proxy_figures_cover_a_sliding_window_not_the_last_interval() -> None:
    source = ProxyMetricsSource(["http://proxy/metrics"], window_s=10.0)
    name = "gen_ai_server_request_duration_seconds"

    def read(at: float, fast: int, slow: int, tokens: int) -> dict[str, Any]:
        text = _histogram(name, {"0.5": fast, "1.0": fast + slow, "+Inf": fast + slow}, tokens)
        return source.figures(source.parse_for_test([text], at=at), [])

    read(0.0, 0, 0, 0)  # before any call
    assert read(1.0, 4, 0, 40)["latency_s"]["p99"] <= 0.5  # a burst of fast calls
    # No call since: the last interval is empty, but the window still holds the burst.
    quiet = read(2.0, 4, 0, 40)
    assert quiet["latency_s"]["p50"] is not None
    assert quiet["latency_s"]["p99"] <= 0.5
    assert quiet["tokens_per_s"] == pytest.approx(20.0)  # 40 tokens over the 2 s since the window's start
    # Slow calls later: both bursts in the window.
    mixed = read(9.0, 4, 4, 80)
    assert mixed["latency_s"]["p50"] == pytest.approx(0.5)
    assert mixed["latency_s"]["p99"] > 0.5
    # Past the window, the window starts at the read at t=1 (the newest at least 10 s old): the fast burst drops.
    later = read(11.5, 4, 4, 80)
    assert later["latency_s"]["p50"] > 0.5
    assert later["tokens_per_s"] == pytest.approx(40 / 10.5)
    # Long after the last call: nothing in the window, so the tiles go blank.
    assert read(30.0, 4, 4, 80)["latency_s"]["p50"] is None
    # An endpoint read before its first call exports no token series yet: that counts as zero, so a rate follows.
    fresh = ProxyMetricsSource(["http://proxy/metrics"])
    assert fresh.figures(fresh.parse_for_test([""], at=0.0), [])["tokens_per_s"] is None
    assert fresh.figures(fresh.parse_for_test([_histogram(name, {"+Inf": 1}, 30)], at=3.0), [])["tokens_per_s"] == 10.0
    with pytest.raises(ValueError, match="window_s"):
        ProxyMetricsSource([], window_s=0)
    assert quantile(0.5, {}) is None
    assert quantile(0.99, {1.0: 1, float("inf"): 5}) == 1.0  # beyond the last finite bound


async def test_hub_builds_nothing_until_watched(env: Env) -> None:
    hub = SnapshotHub(env.data, ProxyMetricsSource([]), interval_s=0.01)
    assert hub.snapshots_built == 0
    async with hub.watch() as queue:
        snapshot = await queue.get()
        assert "history" in snapshot
        assert snapshot["proxy"]["source"] == ""
        assert hub.watchers == 1
    built = hub.snapshots_built
    assert built >= 1
    assert hub.watchers == 0
    await hub.close()
    assert hub.snapshots_built == built  # the loop stopped with its last watcher


async def test_a_stream_sends_the_history_once_then_only_new_points(env: Env) -> None:
    hub = SnapshotHub(env.data, ProxyMetricsSource([]))
    first, second, third = [await hub.build() for _ in range(3)]
    body, sent = event_body(first, 0)  # a new watcher: the whole ring
    assert body is first
    assert [p["seq"] for p in body["history"]] == [1]
    assert sent == 1
    body, sent = event_body(third, sent)  # it skipped the second snapshot (slow): both new points come
    assert "history" not in body
    assert [p["seq"] for p in body["history_append"]] == [2, 3]
    assert body["tasks"] == third["tasks"]
    assert sent == 3
    assert "history" in third  # the shared snapshot is left whole for the other watchers
    body, sent = event_body(third, sent)  # nothing new
    assert body["history_append"] == []
    assert sent == 3
    del second
    # A watcher so far behind that the ring dropped points it never got: the whole ring again.
    for _ in range(HISTORY_POINTS + 2):
        latest = await hub.build()
    assert latest["history"][0]["seq"] > 4
    body, sent = event_body(latest, 3)
    assert len(body["history"]) == HISTORY_POINTS
    assert sent == HISTORY_POINTS + 5
    await hub.close()
