"""Unit tests of staleness: the lag computation, the keep/resample/drop decisions, their statistics and storage.

SQLite in a temporary file, the in-memory fake gateway client, a hand-driven clock and a hand-set fleet version.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from polar.common.v1 import session_pb2, task_pb2, trace_pb2

from polar_core.errors import InvalidArgument
from polar_core.records import TerminalStatus
from rollout_server.convert import new_task_from_proto, result_from_proto, result_to_proto, summary_to_proto
from rollout_server.core import RolloutCore
from rollout_server.models import (
    CallbackTarget,
    CoreConfig,
    GatewayRecord,
    NewTask,
    ResultRecord,
    SchedulerConfig,
    SessionState,
    StalePolicy,
    TaskRecord,
    TaskState,
)
from rollout_server.ports import SessionDispatch
from rollout_server.scheduler import Scheduler
from rollout_server.staleness import (
    StaleDecision,
    StoreCurrentPolicyVersion,
    decide,
    fleet_version,
    policy_lag,
)
from rollout_server.store.sql import SqlStore, schema
from rollout_server.store.sqlite import TYPES as SQLITE_TYPES
from rollout_server.store.sqlite import open_sqlite_store
from rollout_server.testing.fakes import FakeGatewayClient, ManualClock, make_result


class Fleet:
    """The fleet's current version, set by hand (the fleet coordinator's part)."""

    def __init__(self, version: int = 0) -> None:
        self.version = version

    async def current_version(self) -> int:
        return self.version


@dataclasses.dataclass
class Env:
    store: SqlStore
    core: RolloutCore
    scheduler: Scheduler
    gateways: FakeGatewayClient
    clock: ManualClock
    fleet: Fleet

    async def dispatch(self) -> list[SessionDispatch]:
        before = len(self.gateways.started)
        await self.scheduler.dispatch_once()
        await self.scheduler.wait_for_starts()
        return [d for _, d in self.gateways.started[before:]]

    async def report(self, d: SessionDispatch, versions: list[str], **kw: object) -> None:
        await self.core.report_result(make_result(d, gateway_id="a", policy_versions=versions, **kw))  # type: ignore[arg-type]
        while self.core._background:
            await next(iter(self.core._background))


async def make_env(path: Path, **config: object) -> Env:
    clock, fleet = ManualClock(), Fleet(5)
    store = await open_sqlite_store(path)
    gateways = FakeGatewayClient()
    core = RolloutCore(store, gateways, CoreConfig(**config), clock=clock, current_policy=fleet)  # type: ignore[arg-type]
    scheduler = Scheduler(core, SchedulerConfig())
    await core.register_gateway(GatewayRecord("a", "addr-a", 8))
    return Env(store, core, scheduler, gateways, clock, fleet)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    e = await make_env(tmp_path / "r.sqlite3", max_attempts=2)
    yield e
    await e.core.close()
    await e.store.close()


def new_task(task_id: str, n: int = 1, **kw: Any) -> NewTask:
    return NewTask(
        task_id=task_id,
        spec=task_pb2.Task(task_id=task_id).SerializeToString(),
        spec_hash=f"h-{task_id}",
        num_samples=n,
        **kw,
    )


def test_lag_is_measured_from_the_oldest_version() -> None:
    assert policy_lag(5, ["3", "5", "4"]) == 2
    assert policy_lag(5, ["v1", "step-2"]) == 5  # not a number: the initial policy, 0 (never a hidden lag)
    assert policy_lag(5, ["4", ""]) == 5
    assert policy_lag(5, []) == 0
    assert policy_lag(2, ["4"]) == 0  # never negative
    # A call proves the fleet reached its version even when the port has not heard of it yet.
    assert fleet_version(2, ["1", "4"]) == 4
    assert policy_lag(fleet_version(2, ["1", "4"]), ["1", "4"]) == 3


def test_decisions_follow_the_bound_the_policy_and_the_deadline() -> None:
    task = TaskRecord("t", b"", "h", 1, 0, 0, 60.0, None, TaskState.RUNNING, 0.0, 100.0)
    assert decide(task, 7, now=1.0) is StaleDecision.FRESH  # no bound
    task.max_policy_lag = 1
    assert decide(task, 1, now=1.0) is StaleDecision.FRESH
    assert decide(task, 2, now=1.0) is StaleDecision.KEEP
    task.stale_policy = StalePolicy.RESAMPLE
    assert decide(task, 2, now=1.0) is StaleDecision.RESAMPLE
    assert decide(task, 2, now=100.0) is StaleDecision.DROP  # the deadline leaves no time
    task.max_policy_lag = 0
    assert decide(task, 0, now=1.0) is StaleDecision.FRESH
    assert decide(task, 1, now=1.0) is StaleDecision.RESAMPLE


async def test_default_current_version_is_the_highest_integer_version_recorded(env: Env) -> None:
    port = StoreCurrentPolicyVersion(env.store)
    assert await port.current_version() == 0
    await env.core.submit_task(new_task("t", 2))
    d0, d1 = await env.dispatch()
    await env.report(d0, ["3", "v9"])
    await env.report(d1, ["10", "2"])
    assert await port.current_version() == 10


async def test_server_defaults_apply_unless_the_task_sets_its_own(tmp_path: Path) -> None:
    e = await make_env(tmp_path / "d.sqlite3", default_max_policy_lag=2, default_stale_policy=StalePolicy.RESAMPLE)
    try:
        await e.core.submit_task(new_task("defaults"))
        await e.core.submit_task(new_task("own", max_policy_lag=0, stale_policy=StalePolicy.KEEP))
        defaults, own = await e.store.get_task("defaults"), await e.store.get_task("own")
        assert defaults is not None
        assert own is not None
        assert (defaults.max_policy_lag, defaults.stale_policy) == (2, StalePolicy.RESAMPLE)
        assert (own.max_policy_lag, own.stale_policy) == (0, StalePolicy.KEEP)
    finally:
        await e.core.close()
        await e.store.close()
    plain = await make_env(tmp_path / "p.sqlite3")
    try:
        await plain.core.submit_task(new_task("unbounded"))
        task = await plain.store.get_task("unbounded")
        assert task is not None
        assert (task.max_policy_lag, task.stale_policy) == (None, StalePolicy.KEEP)
    finally:
        await plain.core.close()
        await plain.store.close()


async def test_keep_records_the_lag_and_counts_stale_sessions(env: Env) -> None:
    await env.core.submit_task(new_task("t", 3, max_policy_lag=1, stale_policy=StalePolicy.KEEP))
    d0, d1, d2 = await env.dispatch()
    await env.report(d0, ["3", "5"])  # lag 2: beyond the bound, kept
    await env.report(d1, ["4"])  # lag 1: within
    await env.report(d2, [])  # no version: lag 0
    summary, results = await env.core.get_task("t")
    assert [r.policy_lag for r in results] == [2, 1, 0]
    assert all(r.status is TerminalStatus.RESOLVED for r in results)
    st = summary.statistics
    assert (st.sessions_stale_kept, st.sessions_stale_resampled) == (1, 0)
    assert (st.policy_lag.count, st.policy_lag.max, st.policy_lag.mean) == (3, 2.0, 1.0)
    assert summary.task.state is TaskState.COMPLETED
    info = summary_to_proto(summary)
    assert info.statistics.sessions_stale_kept == 1
    assert info.statistics.policy_lag.max == 2.0


async def test_resample_discards_the_stale_attempt_without_using_up_attempts(env: Env) -> None:
    callback = CallbackTarget("http", "http://trainer.invalid/results")
    await env.core.submit_task(new_task("t", 1, max_policy_lag=0, stale_policy=StalePolicy.RESAMPLE, callback=callback))
    (first,) = await env.dispatch()
    await env.report(first, ["4", "5"])  # lag 1 > 0: sampled again at once, no backoff
    (session,) = await env.store.task_sessions("t")
    assert (session.state, session.attempt, session.stale_resamples, session.infra_failures) == (
        SessionState.PENDING,
        1,
        1,
        0,
    )
    assert await env.store.get_result(session.session_id) is None
    (second,) = await env.dispatch()
    assert second.attempt == 2
    # An infra_error after a resample is still retried: max_attempts=2 counts infra attempts only.
    await env.report(second, [], status=TerminalStatus.INFRA_ERROR)
    env.clock.now += 10
    (third,) = await env.dispatch()
    assert third.attempt == 3
    await env.report(third, ["5"], reward=0.5)
    summary, results = await env.core.get_task("t")
    (result,) = results
    assert (result.attempt, result.policy_lag, result.reward) == (3, 0, 0.5)
    st = summary.statistics
    assert (st.sessions_stale_resampled, st.sessions_stale_kept, st.sessions_retried, st.attempts_total) == (1, 0, 1, 3)
    assert summary.sessions_by_status == {"resolved": 1}
    # Only the fresh result was queued for the trainer.
    due = await env.store.due_deliveries(env.clock.now + 1, 10)
    assert [d.idempotency_key for d in due] == [result.idempotency_key]
    # A repeated report of the discarded attempt is a duplicate, not a second result.
    assert await env.core.report_result(make_result(first, gateway_id="a", policy_versions=["4"]))


async def test_an_untrainable_stale_result_is_recorded_as_it_is(env: Env) -> None:
    await env.core.submit_task(new_task("t", 1, max_policy_lag=0, stale_policy=StalePolicy.RESAMPLE))
    for _ in range(2):  # max_attempts=2: the second infra_error is final
        (d,) = await env.dispatch()
        await env.report(d, ["3"], status=TerminalStatus.INFRA_ERROR)
        env.clock.now += 10
    summary, (result,) = await env.core.get_task("t")
    assert (result.status, result.attempt, result.policy_lag) == (TerminalStatus.INFRA_ERROR, 2, 2)
    assert summary.statistics.sessions_stale_resampled == 0


async def test_a_stale_result_past_the_deadline_is_dropped_not_delivered(env: Env) -> None:
    await env.core.submit_task(new_task("t", 1, max_policy_lag=0, stale_policy=StalePolicy.RESAMPLE))
    (d,) = await env.dispatch()
    task = await env.store.get_task("t")
    assert task is not None
    env.clock.now = task.deadline + 1  # the watchdog has not expired the task yet
    result = make_result(d, gateway_id="a", policy_versions=["3"])
    result.payload = b"traces"
    await env.core.report_result(result)
    (stored,) = await env.store.task_results("t")
    assert stored.status is TerminalStatus.CANCELLED
    assert stored.payload == b""
    assert stored.policy_lag == 2
    assert "max_policy_lag 0" in stored.error_message


async def test_every_trace_carries_its_own_lag() -> None:
    pb = session_pb2.SessionResult(session_id="s", status="resolved", attempt=1)
    pb.traces.append(trace_pb2.Trace(policy_versions=["1"]))
    pb.traces.append(trace_pb2.Trace(policy_versions=["2", "3"]))
    pb.traces.append(trace_pb2.Trace(policy_versions=["v7"]))
    record = result_from_proto(pb)
    assert record.policy_versions == ["1", "2", "3", "v7"]
    record.fleet_version, record.policy_lag = 3, 3
    back = result_to_proto(record)
    assert back.policy_lag == 3
    assert [t.policy_lag for t in back.traces] == [2, 1, 3]  # "v7" is not a number: the initial policy, 0


def test_submitted_bounds_are_checked() -> None:
    base = task_pb2.Task(task_id="t", instruction="x", num_samples=1)
    assert new_task_from_proto(base).max_policy_lag is None
    assert new_task_from_proto(base).stale_policy is None
    task = task_pb2.Task(
        task_id="t", instruction="x", num_samples=1, max_policy_lag=0, stale_policy=task_pb2.STALE_POLICY_RESAMPLE
    )
    new = new_task_from_proto(task)
    assert (new.max_policy_lag, new.stale_policy) == (0, StalePolicy.RESAMPLE)
    assert new.spec_hash != new_task_from_proto(base).spec_hash
    with pytest.raises(InvalidArgument, match="max_policy_lag"):
        new_task_from_proto(task_pb2.Task(task_id="t", instruction="x", num_samples=1, max_policy_lag=-1))
    with pytest.raises(InvalidArgument, match="stale_policy"):
        new_task_from_proto(task_pb2.Task(task_id="t", instruction="x", num_samples=1, stale_policy=7))  # type: ignore[arg-type]


async def test_a_database_from_before_staleness_gains_its_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    added = (
        ",\n  max_policy_lag INTEGER",
        ",\n  stale_policy TEXT NOT NULL DEFAULT 'keep'",
        ",\n  stale_resamples INTEGER NOT NULL DEFAULT 0",
        ",\n  policy_lag INTEGER NOT NULL DEFAULT 0",
        ",\n  fleet_version INTEGER NOT NULL DEFAULT 0",
    )
    old_schema = schema(SQLITE_TYPES)
    for column in added:
        old_schema = [s.replace(column, "") for s in old_schema]
    assert all(name not in s for s in old_schema for name in ("stale_", "policy_lag", "fleet_version"))
    old_row = {"task_id": "old", "spec": b"", "spec_hash": "h", "num_samples": 1, "priority": 0, "early_stop": 0}
    old_row |= {"session_timeout_s": 60.0, "callback_kind": "", "callback_target": "", "callback_max_attempts": 0}
    old_row |= {"state": "pending", "submitted_at": 1.0, "deadline": 2.0, "error_message": ""}
    with sqlite3.connect(path) as db:
        db.executescript(";\n".join(old_schema))
        names = ", ".join(old_row)
        db.execute(f"INSERT INTO tasks ({names}) VALUES ({', '.join('?' * len(old_row))})", tuple(old_row.values()))
    store = await open_sqlite_store(path)
    try:
        old = await store.get_task("old")
        assert old is not None
        assert (old.max_policy_lag, old.stale_policy) == (None, StalePolicy.KEEP)
        core = RolloutCore(store, FakeGatewayClient(), current_policy=Fleet(2))
        await core.submit_task(new_task("new", 1, max_policy_lag=1, stale_policy=StalePolicy.RESAMPLE))
        new = await store.get_task("new")
        assert new is not None
        assert (new.max_policy_lag, new.stale_policy) == (1, StalePolicy.RESAMPLE)
        await core.close()
    finally:
        await store.close()


def test_result_record_defaults_have_no_lag() -> None:
    record = ResultRecord("s", "t", 0, TerminalStatus.RESOLVED, 1.0, 1, "g", "k")
    assert (record.policy_lag, record.fleet_version) == (0, 0)
