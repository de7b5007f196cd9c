"""Unit tests of the domain: submission, dispatch, backpressure, retries, early stop, timeouts, recovery.

No ports: SQLite in a temporary file, an in-memory fake gateway client, and a hand-driven clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from polar_core.errors import AlreadyExists, Internal, InvalidArgument, NotFound, PermissionDenied
from polar_core.records import TerminalStatus
from rollout_server.core import RolloutCore
from rollout_server.delivery import Deliverer
from rollout_server.errors import StaleAttempt
from rollout_server.models import (
    CallbackTarget,
    CoreConfig,
    DeliveryConfig,
    DeliveryState,
    GatewayRecord,
    NewTask,
    SchedulerConfig,
    SessionState,
    TaskState,
    check_session_transition,
    check_task_transition,
)
from rollout_server.ports import SessionDispatch
from rollout_server.scheduler import Scheduler
from rollout_server.store.sql import SqlStore, schema
from rollout_server.store.sqlite import TYPES as SQLITE_TYPES
from rollout_server.store.sqlite import open_sqlite_store
from rollout_server.testing.fakes import FakeGatewayClient, ManualClock, RecordingSender, make_result


@dataclasses.dataclass
class Env:
    store: SqlStore
    core: RolloutCore
    scheduler: Scheduler
    gateways: FakeGatewayClient
    clock: ManualClock
    path: Path

    async def add_gateway(self, gid: str, capacity: int) -> None:
        await self.core.register_gateway(GatewayRecord(gid, f"addr-{gid}", capacity))

    async def dispatch(self) -> int:
        n = await self.scheduler.dispatch_once()
        await self.scheduler.wait_for_starts()
        return n

    async def finish_all(self, status: TerminalStatus = TerminalStatus.RESOLVED) -> int:
        count = 0
        for address, held in list(self.gateways.sessions.items()):
            for sid, s in list(held.items()):
                if s.done or s.cancelled:
                    continue
                result = make_result(s.dispatch, gateway_id=address.removeprefix("addr-"), status=status)
                self.gateways.finish(address, sid, result)
                await self.core.report_result(dataclasses.replace(result))
                count += 1
        await settle(self.core)
        return count


async def settle(core: RolloutCore) -> None:
    while core._background:
        await next(iter(core._background))


def new_task(task_id: str = "t1", n: int = 4, **kw: object) -> NewTask:
    return NewTask(task_id=task_id, spec=f"spec-{task_id}".encode(), spec_hash=f"h-{task_id}", num_samples=n, **kw)  # type: ignore[arg-type]


async def make_env(path: Path, gateways: FakeGatewayClient | None = None, **config: object) -> Env:
    clock = ManualClock()
    store = await open_sqlite_store(path)
    fake = gateways or FakeGatewayClient()
    core = RolloutCore(store, fake, CoreConfig(retry_backoff_s=1.0, **config), clock=clock)  # type: ignore[arg-type]
    scheduler = Scheduler(core, SchedulerConfig(busy_backoff_s=2.0, deadline_slack_s=1.0))
    return Env(store, core, scheduler, fake, clock, path)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    e = await make_env(tmp_path / "r.sqlite3")
    yield e
    await e.core.close()
    await e.store.close()


def test_state_machines_refuse_illegal_moves() -> None:
    check_session_transition(SessionState.PENDING, SessionState.STARTING)
    check_task_transition(TaskState.PENDING, TaskState.RUNNING)
    with pytest.raises(Internal):
        check_session_transition(SessionState.DONE, SessionState.PENDING)
    with pytest.raises(Internal):
        check_session_transition(SessionState.PENDING, SessionState.RUNNING)
    with pytest.raises(Internal):
        check_task_transition(TaskState.COMPLETED, TaskState.RUNNING)


async def test_submit_is_idempotent_and_refuses_other_content(env: Env) -> None:
    first, existed = await env.core.submit_task(new_task())
    assert not existed
    assert first.sessions_total == 4
    assert first.task.state is TaskState.PENDING
    again, existed = await env.core.submit_task(new_task())
    assert existed
    assert again.task.seq == first.task.seq
    with pytest.raises(AlreadyExists):
        await env.core.submit_task(dataclasses.replace(new_task(), spec_hash="other"))
    with pytest.raises(InvalidArgument):
        await env.core.submit_task(new_task("bad id!"))
    with pytest.raises(InvalidArgument):
        await env.core.submit_task(new_task("t2", 0))
    with pytest.raises(NotFound):
        await env.core.get_task("nope")
    assert len(await env.store.task_sessions("t1")) == 4


async def test_dispatch_fills_free_capacity_by_priority(env: Env) -> None:
    await env.add_gateway("a", 2)
    await env.add_gateway("b", 1)
    await env.core.submit_task(new_task("low", 3, priority=0))
    await env.core.submit_task(new_task("high", 2, priority=5))
    assert await env.dispatch() == 3
    started = [d.session_id for _, d in env.gateways.started]
    assert started[:2] == ["high-0000", "high-0001"]
    assert started[2] == "low-0000"
    per_gateway = {a: len(s) for a, s in env.gateways.sessions.items()}
    assert per_gateway == {"addr-a": 2, "addr-b": 1}
    assert await env.dispatch() == 0  # full
    sessions = {s.session_id: s for s in await env.store.task_sessions("high")}
    assert all(s.state is SessionState.RUNNING and s.attempt == 1 for s in sessions.values())
    assert (await env.store.get_task("high")).state is TaskState.RUNNING  # type: ignore[union-attr]
    await env.finish_all()
    assert await env.dispatch() == 2


async def test_busy_gateway_backs_off_without_using_an_attempt(env: Env) -> None:
    await env.add_gateway("a", 4)
    env.gateways.busy["addr-a"] = 5.0
    await env.core.submit_task(new_task("t", 2))
    assert await env.dispatch() == 2
    sessions = await env.store.task_sessions("t")
    assert all(s.state is SessionState.PENDING and s.attempt == 0 for s in sessions)
    del env.gateways.busy["addr-a"]
    assert await env.dispatch() == 0  # still inside the hinted delay
    env.clock.now += 5.1
    assert await env.dispatch() == 2
    assert all(s.attempt == 1 for s in await env.store.task_sessions("t"))


async def test_infra_errors_are_retried_but_model_failures_are_final(env: Env) -> None:
    await env.add_gateway("a", 4)
    await env.core.submit_task(new_task("t", 2))
    await env.dispatch()
    (_, d0), (_, d1) = env.gateways.started
    assert not await env.core.report_result(make_result(d0, gateway_id="a", status=TerminalStatus.INFRA_ERROR))
    assert not await env.core.report_result(make_result(d1, gateway_id="a", status=TerminalStatus.AGENT_TIMEOUT))
    await settle(env.core)
    s0, s1 = await env.store.task_sessions("t")
    assert s0.state is SessionState.PENDING
    assert s0.infra_failures == 1
    assert s1.state is SessionState.DONE
    assert await env.dispatch() == 0  # retry backoff
    env.clock.now += 1.0
    assert await env.dispatch() == 1
    # Attempts 2 and 3 fail too: the third infra_error is final (max_attempts=3).
    for attempt in (2, 3):
        _, d = env.gateways.started[-1]
        assert d.attempt == attempt
        await env.core.report_result(make_result(d, gateway_id="a", status=TerminalStatus.INFRA_ERROR))
        env.clock.now += 10
        await env.dispatch()
    await settle(env.core)
    s0 = (await env.store.task_sessions("t"))[0]
    assert s0.state is SessionState.DONE
    assert s0.attempt == 3
    summary, results = await env.core.get_task("t")
    assert summary.task.state is TaskState.COMPLETED
    assert {r.status for r in results} == {TerminalStatus.INFRA_ERROR, TerminalStatus.AGENT_TIMEOUT}
    assert summary.statistics.sessions_retried == 1
    assert summary.statistics.attempts_total == 4
    assert summary.statistics.sessions_dropped == 1
    assert summary.statistics.sessions_truncated == 1


async def test_reports_are_checked_and_idempotent(env: Env) -> None:
    await env.add_gateway("a", 4)
    await env.core.submit_task(new_task("t", 1))
    await env.dispatch()
    _, d = env.gateways.started[0]
    with pytest.raises(PermissionDenied):
        await env.core.report_result(make_result(d, gateway_id="intruder"))
    with pytest.raises(NotFound):
        await env.core.report_result(make_result(session_id="ghost", gateway_id="a"))
    assert not await env.core.report_result(make_result(d, gateway_id="a"))
    assert await env.core.report_result(make_result(d, gateway_id="a"))  # duplicate
    with pytest.raises(StaleAttempt):
        await env.core.report_result(dataclasses.replace(make_result(d, gateway_id="a"), idempotency_key="other"))
    await settle(env.core)
    _, results = await env.core.get_task("t")
    assert len(results) == 1
    assert results[0].result_index == 0


async def test_a_report_racing_the_dispatchers_running_update_is_applied(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast gateway's report read the session while it was still ``starting``; the dispatcher's ``running``
    update landed before the report was written. The report is applied (not refused as stale, which left the
    result behind until the session's deadline or its gateway's lease ran out)."""
    await env.add_gateway("a", 4)
    await env.core.submit_task(new_task("t", 1))
    await env.dispatch()
    _, d = env.gateways.started[0]
    real_get = env.store.get_session
    reads = 0

    async def read_before_the_update(session_id: str) -> object:
        nonlocal reads
        reads += 1
        record = await real_get(session_id)
        if reads == 1 and record is not None:
            assert record.state is SessionState.RUNNING
            return dataclasses.replace(record, state=SessionState.STARTING)
        return record

    monkeypatch.setattr(env.store, "get_session", read_before_the_update)
    assert not await env.core.report_result(make_result(d, gateway_id="a"))
    assert reads >= 2
    session = await real_get(d.session_id)
    assert session is not None
    assert session.state is SessionState.DONE
    await settle(env.core)
    _, results = await env.core.get_task("t")
    assert [r.status for r in results] == [TerminalStatus.RESOLVED]


async def test_early_stop_cancels_stragglers(env: Env) -> None:
    await env.add_gateway("a", 8)
    await env.core.submit_task(new_task("t", 4, early_stop_min_usable=2))
    await env.dispatch()
    for _, d in env.gateways.started[:2]:
        await env.core.report_result(make_result(d, gateway_id="a"))
    await settle(env.core)
    summary, results = await env.core.get_task("t")
    assert summary.task.state is TaskState.COMPLETED
    assert [r.status for r in results] == [TerminalStatus.RESOLVED] * 2 + [TerminalStatus.CANCELLED] * 2
    assert sorted(sid for _, sid in env.gateways.cancelled) == ["t-0002", "t-0003"]
    assert summary.sessions_usable == 2
    assert summary.statistics.sessions_dropped == 2


async def test_task_deadline_cancels_unfinished_sessions(env: Env) -> None:
    await env.add_gateway("a", 1)
    await env.core.submit_task(new_task("t", 2, task_timeout_s=60.0))
    await env.dispatch()
    env.clock.now += 61
    await env.add_gateway("a", 1)  # renew the lease so only the task deadline matters
    await env.scheduler.watchdog_once()
    await settle(env.core)
    summary, results = await env.core.get_task("t")
    assert summary.task.state is TaskState.COMPLETED
    assert "deadline" in summary.task.error_message
    assert [r.status for r in results] == [TerminalStatus.CANCELLED] * 2


async def test_cancel_task(env: Env) -> None:
    await env.add_gateway("a", 1)
    await env.core.submit_task(new_task("t", 3))
    await env.dispatch()
    summary = await env.core.cancel_task("t", "user")
    await settle(env.core)
    assert summary.task.state is TaskState.CANCELLED
    assert summary.sessions_done == 3
    assert env.gateways.cancelled == [("addr-a", "t-0000")]
    again = await env.core.cancel_task("t", "again")
    assert again.task.state is TaskState.CANCELLED


async def test_overdue_session_is_retried(env: Env) -> None:
    await env.add_gateway("a", 1)
    await env.core.submit_task(new_task("t", 1, session_timeout_s=10.0))
    await env.dispatch()
    env.clock.now += 10 + env.core.config.session_grace_s + 2
    await env.add_gateway("a", 1)
    await env.scheduler.watchdog_once()
    session = (await env.store.task_sessions("t"))[0]
    assert session.state is SessionState.PENDING
    assert session.infra_failures == 1
    assert env.gateways.cancelled == [("addr-a", "t-0000")]


async def test_restart_reconciles_in_flight_sessions(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    first = await make_env(path)
    await first.add_gateway("a", 3)
    await first.core.submit_task(new_task("t", 3))
    await first.dispatch()
    fake = first.gateways
    (_, d0), (_, d1), (_, d2) = fake.started
    fake.finish("addr-a", d0.session_id, make_result(d0, gateway_id="a"))  # finished, report lost in the crash
    del fake.sessions["addr-a"][d2.session_id]  # lost by the gateway
    await first.core.close()
    await first.store.close()

    second = await make_env(path, fake)
    second.clock.now = first.clock.now
    assert await second.scheduler.reconcile() == 3
    await settle(second.core)
    states = {s.session_id: s for s in await second.store.task_sessions("t")}
    assert states[d0.session_id].state is SessionState.DONE
    assert states[d1.session_id].state is SessionState.RUNNING  # re-attached
    assert states[d2.session_id].state is SessionState.PENDING
    assert states[d2.session_id].infra_failures == 1
    second.clock.now += 5
    assert await second.dispatch() == 1
    await second.finish_all()
    summary, results = await second.core.get_task("t")
    assert summary.task.state is TaskState.COMPLETED
    assert len(results) == 3
    await second.core.close()
    await second.store.close()


async def test_restart_never_reuses_the_attempt_of_an_interrupted_start(tmp_path: Path) -> None:
    # The server stops right after the gateway accepted two starts, before it recorded them as running; then
    # the gateway loses one. A session still ``starting`` that the gateway does not know may have run there.
    path = tmp_path / "r.sqlite3"
    first = await make_env(path, max_attempts=1)
    await first.add_gateway("a", 2)
    await first.core.submit_task(new_task("t", 2))

    def stop_now(address: str, dispatch: SessionDispatch) -> None:
        current = asyncio.current_task()
        assert current is not None
        current.cancel()  # as Scheduler.close does when the server stops with the reply in flight

    first.gateways.on_start = stop_now
    assert await first.scheduler.dispatch_once() == 2
    await first.scheduler.wait_for_starts()
    await first.scheduler.close()
    assert {s.state for s in await first.store.task_sessions("t")} == {SessionState.STARTING}
    await first.core.close()
    await first.store.close()
    del first.gateways.sessions["addr-a"]["t-0001"]

    second = await make_env(path, first.gateways, max_attempts=1)
    second.clock.now = first.clock.now
    assert await second.scheduler.reconcile() == 2
    states = {s.session_id: s for s in await second.store.task_sessions("t")}
    assert (states["t-0000"].state, states["t-0000"].attempt) == (SessionState.RUNNING, 1)  # re-attached
    lost = states["t-0001"]
    assert (lost.state, lost.attempt, lost.infra_failures, lost.outages) == (SessionState.PENDING, 1, 0, 1)
    second.clock.now += 5
    assert await second.dispatch() == 1
    # A fresh attempt number (its own model-proxy session and result key), not one of max_attempts=1 used up.
    assert [(d.session_id, d.attempt) for _, d in second.gateways.started[2:]] == [("t-0001", 2)]
    await second.finish_all()
    summary, results = await second.core.get_task("t")
    assert summary.task.state is TaskState.COMPLETED
    assert sorted((r.session_id, r.status, r.attempt) for r in results) == [
        ("t-0000", TerminalStatus.RESOLVED, 1),
        ("t-0001", TerminalStatus.RESOLVED, 2),
    ]
    await second.core.close()
    await second.store.close()


async def test_watch_replays_then_streams(env: Env) -> None:
    await env.add_gateway("a", 2)
    await env.core.submit_task(new_task("t", 2))
    await env.dispatch()
    _, d0 = env.gateways.started[0]
    await env.core.report_result(make_result(d0, gateway_id="a"))
    seen: list[int] = []
    async for result, summary in env.core.watch_task("t"):
        if result is None:
            assert summary.task.state is TaskState.COMPLETED
            break
        seen.append(result.result_index)
        if len(seen) == 1:
            await env.finish_all()
    assert seen == [0, 1]
    resumed = [r.result_index async for r, _ in env.core.watch_task("t", 1) if r is not None]
    assert resumed == [1]


async def test_list_tasks_pages_newest_first(env: Env) -> None:
    for i in range(5):
        await env.core.submit_task(new_task(f"t{i}", 1))
    page = await env.core.list_tasks(2, "", None)
    assert [s.task.task_id for s in page.tasks] == ["t4", "t3"]
    page = await env.core.list_tasks(2, page.next_page_token, None)
    page = await env.core.list_tasks(2, page.next_page_token, None)
    assert [s.task.task_id for s in page.tasks] == ["t0"]
    assert page.next_page_token == ""
    with pytest.raises(InvalidArgument):
        await env.core.list_tasks(2, "!!", None)
    assert len((await env.core.list_tasks(0, "", TaskState.COMPLETED)).tasks) == 0


async def test_delivery_retries_then_dead_letters(env: Env) -> None:
    await env.add_gateway("a", 4)
    target = CallbackTarget("grpc", "trainer:1")
    await env.core.submit_task(new_task("t", 2, callback=target))
    await env.dispatch()
    await env.finish_all()
    sender = RecordingSender(failures=2)
    deliverer = Deliverer(
        env.store,
        sender,
        DeliveryConfig(max_attempts=3, backoff_s=1.0),
        clock=env.clock,
        wakeup=env.core.delivery_wakeup,
    )
    assert await deliverer.deliver_once() == 2
    assert await deliverer.deliver_once() == 0  # backing off
    env.clock.now += 1.0
    await deliverer.deliver_once()
    env.clock.now += 2.0
    await deliverer.deliver_once()
    assert len(sender.delivered) == 2
    assert {a for _, _, a in sender.delivered} == {3}
    summary, _ = await env.core.get_task("t")
    assert summary.statistics.deliveries_delivered == 2

    await env.core.submit_task(new_task("u", 1, callback=target))
    await env.dispatch()
    await env.finish_all()
    dead = Deliverer(
        env.store,
        RecordingSender(failures=99, permanent=True),
        DeliveryConfig(),
        clock=env.clock,
        wakeup=env.core.delivery_wakeup,
    )
    await dead.deliver_once()
    letters = await env.store.dead_letters("u")
    assert len(letters) == 1
    assert letters[0].state is DeliveryState.DEAD
    assert letters[0].attempts == 1


class TracingGateways(FakeGatewayClient):
    """A fake gateway client that notes the trace each StartSession call is made in."""

    def __init__(self) -> None:
        super().__init__()
        self.trace_ids: dict[str, int] = {}

    async def start_session(self, address: str, dispatch: SessionDispatch) -> None:
        self.trace_ids[dispatch.session_id] = trace.get_current_span().get_span_context().trace_id
        await super().start_session(address, dispatch)


async def test_sessions_join_the_submitters_trace_after_a_restart(tmp_path: Path) -> None:
    tracer = TracerProvider().get_tracer("test")
    first = await make_env(tmp_path / "r.sqlite3")
    with tracer.start_as_current_span("trainer.submit") as span:
        await first.core.submit_task(new_task("traced", 2))
        submit_trace = span.get_span_context().trace_id
    await first.core.submit_task(new_task("untraced", 1))  # no span: nothing stored, nothing attached
    await first.core.close()
    await first.store.close()

    gateways = TracingGateways()
    second = await make_env(tmp_path / "r.sqlite3", gateways)  # a restarted server: nothing kept in memory
    try:
        await second.add_gateway("a", 4)
        assert await second.dispatch() == 3
        traced = {sid: t for sid, t in gateways.trace_ids.items() if sid.startswith("traced")}
        assert len(traced) == 2
        assert set(traced.values()) == {submit_trace}
        untraced = [t for sid, t in gateways.trace_ids.items() if sid.startswith("untraced")]
        assert untraced == [0]  # INVALID_SPAN: not parented to anything stale
    finally:
        await second.core.close()
        await second.store.close()


async def test_a_database_from_before_trace_context_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    old_schema = [s.replace(",\n  trace_context TEXT NOT NULL DEFAULT ''", "") for s in schema(SQLITE_TYPES)]
    assert all("trace_context" not in s for s in old_schema)
    with sqlite3.connect(path) as db:
        for statement in old_schema:
            db.execute(statement)
        db.execute(
            "INSERT INTO tasks (task_id, spec, spec_hash, num_samples, priority, early_stop, session_timeout_s, "
            "callback_kind, callback_target, callback_max_attempts, state, submitted_at, deadline, finished_at, "
            "error_message) VALUES ('old', x'00', 'h', 1, 0, 0, 60.0, '', '', 0, 'pending', 1.0, 2.0, NULL, '')"
        )
    store = await open_sqlite_store(path)
    try:
        old = await store.get_task("old")
        assert old is not None
        assert old.trace_context == {}
        core = RolloutCore(store, FakeGatewayClient())
        with TracerProvider().get_tracer("test").start_as_current_span("submit"):
            await core.submit_task(new_task("new", 1))
        new = await store.get_task("new")
        assert new is not None
        assert set(new.trace_context) == {"traceparent"}
        await core.close()
    finally:
        await store.close()
    store = await open_sqlite_store(path)  # a second start finds the column and changes nothing
    await store.close()
