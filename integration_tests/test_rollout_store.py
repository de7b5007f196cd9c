"""One contract suite for both stores: SQLite (embedded) and a real PostgreSQL server (several hosts)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from polar.common.v1 import session_pb2

from integration_tests.support.postgres import fresh_database
from polar_core.errors import Internal
from polar_core.records import TerminalStatus
from rollout_server.convert import result_from_proto, result_to_proto
from rollout_server.models import (
    CallbackTarget,
    DeliveryRecord,
    DeliveryState,
    GatewayRecord,
    ResultRecord,
    SessionRecord,
    SessionState,
    TaskRecord,
    TaskState,
)
from rollout_server.store import open_store
from rollout_server.store.sql import SqlStore

StoreFactory = Callable[[], Awaitable[SqlStore]]


@pytest.fixture(params=["sqlite", "postgres"])
async def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    """Opens the same database again on every call (to test durability across reopen)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'rollout.sqlite3'}"
    else:
        url = await fresh_database(request.getfixturevalue("pg_server"))
    opened: list[SqlStore] = []

    async def factory() -> SqlStore:
        store = await open_store(url, tmp_path)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        await store.close()


def task(task_id: str, *, priority: int = 0, callback: CallbackTarget | None = None) -> TaskRecord:
    return TaskRecord(
        task_id=task_id,
        spec=b"\x00spec\xff",
        spec_hash="h",
        num_samples=2,
        priority=priority,
        early_stop_min_usable=0,
        session_timeout_s=60.0,
        callback=callback,
        state=TaskState.PENDING,
        submitted_at=1.0,
        deadline=100.0,
    )


def sessions(task_id: str, n: int = 2, priority: int = 0) -> list[SessionRecord]:
    return [SessionRecord(f"{task_id}-{i}", task_id, i, priority=priority) for i in range(n)]


def result(session: SessionRecord, key: str, versions: list[str] | None = None) -> ResultRecord:
    return ResultRecord(
        session_id=session.session_id,
        task_id=session.task_id,
        sample_index=session.sample_index,
        status=TerminalStatus.RESOLVED,
        reward=1.0,
        attempt=1,
        gateway_id="g",
        idempotency_key=key,
        policy_versions=versions or [],
        payload=b"\x01payload",
        recorded_at=5.0,
    )


async def test_tasks_are_inserted_once_and_paged(store_factory: StoreFactory) -> None:
    store = await store_factory()
    t, created = await store.insert_task(task("a"), sessions("a"))
    assert created
    assert t.seq > 0
    again, created = await store.insert_task(task("a"), sessions("a"))
    assert not created
    assert again.seq == t.seq
    assert again.spec == b"\x00spec\xff"
    await store.insert_task(task("b", priority=3), sessions("b", priority=3))
    await store.insert_task(task("c"), sessions("c"))
    newest = await store.list_tasks(2, None, None)
    assert [x.task_id for x in newest] == ["c", "b"]
    assert [x.task_id for x in await store.list_tasks(2, newest[-1].seq, None)] == ["a"]
    assert await store.set_task_state("a", TaskState.PENDING, TaskState.RUNNING, finished_at=None, error_message="")
    assert not await store.set_task_state("a", TaskState.PENDING, TaskState.RUNNING, finished_at=None, error_message="")
    assert [x.task_id for x in await store.list_tasks(10, None, TaskState.RUNNING)] == ["a"]
    with pytest.raises(Internal):
        await store.set_task_state("a", TaskState.COMPLETED, TaskState.RUNNING, finished_at=None, error_message="")
    assert [x.task_id for x in await store.active_tasks()] == ["a", "b", "c"]
    assert await store.count_active_tasks() == 3


async def test_dispatch_order_and_compare_and_set(store_factory: StoreFactory) -> None:
    store = await store_factory()
    await store.insert_task(task("low"), sessions("low"))
    await store.insert_task(task("high", priority=9), sessions("high", priority=9))
    due = await store.dispatchable_sessions(10.0, 3)
    assert [s.session_id for s in due] == ["high-0", "high-1", "low-0"]
    s = due[0]
    started = SessionRecord(
        s.session_id, s.task_id, 0, SessionState.STARTING, 1, 0, "g", 0.0, 10.0, 70.0, 9, s.task_seq
    )
    assert await store.update_sessions([(started, SessionState.PENDING, 0)]) == [True]
    assert await store.update_sessions([(started, SessionState.PENDING, 0)]) == [False]  # lost race
    with pytest.raises(Internal):
        await store.update_sessions([(started, SessionState.DONE, 1)])
    assert [x.session_id for x in await store.in_flight_sessions()] == ["high-0"]
    assert await store.in_flight_counts() == {"g": 1}
    backoff = SessionRecord("low-0", "low", 0, not_before=50.0, task_seq=due[2].task_seq)
    await store.update_sessions([(backoff, SessionState.PENDING, 0)])
    assert [x.session_id for x in await store.dispatchable_sessions(10.0, 10)] == ["high-1", "low-1"]
    assert (await store.get_session("high-0")) == started


async def test_results_deliveries_and_durability(store_factory: StoreFactory) -> None:
    store = await store_factory()
    cb = CallbackTarget("http", "http://trainer/cb", 4)
    await store.insert_task(task("t", callback=cb), sessions("t"))
    rows = await store.task_sessions("t")
    running = [SessionRecord(r.session_id, "t", r.sample_index, SessionState.RUNNING, 1, 0, "g") for r in rows]
    # Move to running through starting (the state machine forbids skipping it).
    for r, run in zip(rows, running, strict=True):
        starting = SessionRecord(r.session_id, "t", r.sample_index, SessionState.STARTING, 1, 0, "g")
        await store.update_sessions([(starting, SessionState.PENDING, 0), (run, SessionState.STARTING, 1)])
    done0 = SessionRecord(rows[1].session_id, "t", 1, SessionState.DONE, 1, 0, "g")
    delivery = DeliveryRecord("k1", "t", rows[1].session_id, cb, next_attempt_at=3.0)
    recorded = await store.record_result(
        result(rows[1], "k1", ["v2", "v10"]), (done0, SessionState.RUNNING, 1), delivery
    )
    assert recorded is not None
    assert recorded.result_index == 0
    assert await store.record_result(result(rows[1], "k1b"), (done0, SessionState.RUNNING, 1), None) is None
    assert await store.find_report("k1")
    assert not await store.find_report("k1b")
    retry = SessionRecord(rows[0].session_id, "t", 0, SessionState.PENDING, 1, 1, "", 9.0)
    infra = result(rows[0], "k0-infra")
    infra.status = TerminalStatus.INFRA_ERROR
    assert await store.record_attempt(infra, (retry, SessionState.RUNNING, 1))
    assert await store.find_report("k0-infra")
    assert sorted(await store.policy_versions()) == ["v10", "v2"]
    await store.upsert_gateway(GatewayRecord("g", "host:1", 4, labels={"runtime": "docker"}))
    await store.upsert_gateway(GatewayRecord("g", "host:2", 8, draining=True, stage_metrics={"init": {"occupancy": 1}}))

    reopened = await store_factory()
    got = await reopened.task_results("t")
    assert len(got) == 1
    assert got[0].payload == b"\x01payload"
    assert got[0].policy_versions == ["v2", "v10"]
    assert (await reopened.task_results("t", 1)) == []
    assert (await reopened.task_results("t", payload=False))[0].payload == b""
    assert (await reopened.task_results("t", limit=1)) == got
    assert (await reopened.get_result(rows[1].session_id)) == got[0]
    assert (await reopened.get_task("t")).results_count == 1  # type: ignore[union-attr]
    gateway = await reopened.get_gateway("g")
    assert gateway is not None
    assert gateway.address == "host:2"
    assert gateway.draining
    assert gateway.stage_metrics == {"init": {"occupancy": 1}}
    assert len(await reopened.list_gateways()) == 1
    assert (await reopened.get_session(rows[0].session_id)).infra_failures == 1  # type: ignore[union-attr]

    assert await reopened.due_deliveries(2.0, 10) == []
    (due,) = await reopened.due_deliveries(3.0, 10)
    assert due.target == cb
    assert due.attempts == 0
    due.attempts, due.state = 1, DeliveryState.DEAD
    assert await reopened.update_delivery(due, 0)
    assert not await reopened.update_delivery(due, 0)
    assert await reopened.delivery_counts("t") == {DeliveryState.DEAD: 1}
    assert [d.idempotency_key for d in await reopened.dead_letters("t")] == ["k1"]


async def test_trace_context_is_durable_and_added_to_an_older_database(store_factory: StoreFactory) -> None:
    store = await store_factory()
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "k=v"}
    traced = task("traced")
    traced.trace_context = dict(carrier)
    await store.insert_task(traced, sessions("traced"))
    await store.insert_task(task("plain"), sessions("plain"))
    # Make it a database from before the column existed (its rows lose their contexts), as an old release left it.
    async with store._db.transaction() as conn:
        await conn.execute("ALTER TABLE tasks DROP COLUMN trace_context")
    await store.close()
    reopened = await store_factory()  # adds the column back; existing rows take the default
    got = await reopened.get_task("traced")
    assert got is not None
    assert got.trace_context == {}
    assert got.spec == b"\x00spec\xff"
    again = task("again")
    again.trace_context = dict(carrier)
    await reopened.insert_task(again, sessions("again"))
    await reopened.close()
    third = await store_factory()  # reopened once more, with the column present: stored contexts survive
    stored = await third.get_task("again")
    assert stored is not None
    assert stored.trace_context == carrier
    assert [t.trace_context for t in await third.active_tasks()] == [{}, {}, carrier]


async def test_what_the_agent_did_is_kept_with_the_result(store_factory: StoreFactory) -> None:
    # The reported SessionResult's patch, per-test outcomes, log reference and harness logs (issue #12, point 7)
    # come back from GetTask's store read unchanged, in both stores.
    store = await store_factory()
    await store.insert_task(task("kept"), sessions("kept", 1))
    (row,) = await store.task_sessions("kept")
    for state, before in ((SessionState.STARTING, SessionState.PENDING), (SessionState.RUNNING, SessionState.STARTING)):
        moved = SessionRecord(row.session_id, "kept", 0, state, 1, 0, "g")
        await store.update_sessions([(moved, before, 0 if before is SessionState.PENDING else 1)])
    reported = session_pb2.SessionResult(
        session_id=row.session_id,
        task_id="kept",
        status="agent_timeout",
        reward=1.0,
        idempotency_key=f"{row.session_id}/1",
        attempt=1,
        gateway_id="g",
        patch=b"diff --git a/x b/x\n\xff",
        patch_truncated=True,
        eval_log_ref="/evaluations/ev-1/eval.log",
        harness_stdout="out tail",
        harness_stderr="err tail",
        harness_log_truncated=True,
    )
    reported.test_outcomes.add(test_id="tests/test_x.py::test_y", outcome="passed")
    record = result_from_proto(reported)
    record.recorded_at = 5.0
    done = SessionRecord(row.session_id, "kept", 0, SessionState.DONE, 1, 0, "g")
    assert await store.record_result(record, (done, SessionState.RUNNING, 1), None) is not None
    (stored,) = await (await store_factory()).task_results("kept")
    back = result_to_proto(stored)
    for field in ("patch", "patch_truncated", "eval_log_ref", "harness_stdout", "harness_stderr"):
        assert getattr(back, field) == getattr(reported, field), field
    assert back.harness_log_truncated
    assert [(t.test_id, t.outcome) for t in back.test_outcomes] == [("tests/test_x.py::test_y", "passed")]
