"""The session pipeline with fake seams: stages, statuses, cancellation, deadlines, prewarm, backpressure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from gateway.core import SessionPipeline
from gateway.errors import GatewayBusy, GatewayDraining, SessionConflict, SessionNotFound
from gateway.models import EvaluatorConfig, HarnessConfig, PipelineConfig, SessionSpec, Stage
from gateway.testing import (
    FakeAgentRunner,
    FakeEvaluator,
    FakeProxy,
    FakeReconstructor,
    FakeRuntimeFactory,
    RecordingSink,
)
from polar_core.errors import InvalidArgument, Unavailable
from polar_core.records import TerminalStatus


class World:
    """A pipeline over fakes, with handles on each fake."""

    def __init__(self, *, with_evaluator: bool = True, **config: Any) -> None:
        self.config = PipelineConfig(**{"step_retries": 1, **config})
        self.runtimes = FakeRuntimeFactory()
        self.proxy = FakeProxy()
        self.agents = FakeAgentRunner(self.proxy)
        self.evaluator = FakeEvaluator()
        self.reconstructor = FakeReconstructor()
        self.sink = RecordingSink()
        self.pipeline = SessionPipeline(
            self.config,
            gateway_id="gw-test",
            runtimes=self.runtimes,
            agents=self.agents,
            proxy=self.proxy,
            reconstructor=self.reconstructor,
            evaluator=self.evaluator if with_evaluator else None,
            sink=self.sink,
        )


def spec(session_id: str = "s1", *, evaluator: str = "script", priority: int = 0, **kw: Any) -> SessionSpec:
    options = kw.pop("evaluator_options", {})
    return SessionSpec(
        session_id=session_id,
        task_id="t1",
        harness=HarnessConfig("fake"),
        instruction="fix it",
        evaluator=EvaluatorConfig(evaluator, options),
        priority=priority,
        **kw,
    )


async def until(predicate: Callable[[], bool], limit_s: float = 5.0) -> None:
    async with asyncio.timeout(limit_s):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.005)


async def wait_stage(world: World, session_id: str, stage: Stage) -> None:
    await until(lambda: world.pipeline.get_session(session_id)[0].stage is stage)


async def test_session_runs_all_stages_and_reports_resolved() -> None:
    world = World()
    events = world.pipeline.watch(session_ids=["s1"])
    state, again = await world.pipeline.start_session(spec())
    assert not again
    assert state.stage is Stage.INIT
    result = await world.pipeline.wait_done("s1")

    assert result.status is TerminalStatus.RESOLVED
    assert result.reward == 1.0
    assert result.completions == 2
    assert [t.call_ids for t in result.traces] == [["s1-0"], ["s1-1"]]
    assert result.prompt_tokens == 6
    assert result.response_tokens == 4
    assert set(result.timings) == {"init", "ready", "running", "postrun", "total"}
    assert world.sink.results == [result]
    runtime = world.runtimes.created["s1"]
    assert runtime.started
    assert runtime.stopped
    assert not runtime.cancelled
    assert "s1" in world.proxy.closed
    assert world.evaluator.released == ["h-s1/1"]

    stages = []
    async with asyncio.timeout(2):
        async for event in events:
            stages.append((event.previous, event.state.stage))
            if event.state.stage is Stage.DONE:
                assert event.result == result
                break
    events.close()
    assert stages == [
        (None, Stage.INIT),
        (Stage.INIT, Stage.READY),
        (Stage.READY, Stage.RUNNING),
        (Stage.RUNNING, Stage.POSTRUN),
        (Stage.POSTRUN, Stage.DONE),
    ]
    state, stored = world.pipeline.get_session("s1")
    assert state.stage is Stage.DONE
    assert state.status is TerminalStatus.RESOLVED
    assert stored == result


async def test_start_is_idempotent_and_conflicts_on_other_attempt() -> None:
    world = World()
    world.agents.run_s = 0.2
    await world.pipeline.start_session(spec())
    _, again = await world.pipeline.start_session(spec())
    assert again
    with pytest.raises(SessionConflict):
        await world.pipeline.start_session(spec(attempt=2))
    await world.pipeline.wait_done("s1")
    # A finished session may be retried with a new attempt.
    state, again = await world.pipeline.start_session(spec(attempt=2))
    assert not again
    assert state.attempt == 2
    assert (await world.pipeline.wait_done("s1")).attempt == 2
    assert len(world.sink.results) == 2


async def test_unknown_harness_and_session_are_refused() -> None:
    world = World()
    with pytest.raises(InvalidArgument):
        await world.pipeline.start_session(
            SessionSpec(session_id="x", task_id="t", harness=HarnessConfig("no-such-harness"))
        )
    with pytest.raises(SessionNotFound):
        world.pipeline.get_session("nope")
    with pytest.raises(InvalidArgument):
        SessionSpec(session_id="", task_id="t", harness=HarnessConfig("fake"))


async def test_agent_timeout_keeps_captured_calls() -> None:
    world = World()
    world.agents.run_s = 5.0
    world.agents.calls = 4  # one call every second: the first lands before the 1.5 s budget ends
    result_task = asyncio.create_task(_run(world, spec(agent_timeout_s=1.5)))
    result = await result_task
    assert result.status is TerminalStatus.AGENT_TIMEOUT
    assert result.reward == 1.0  # a timed-out attempt is still scored (gateway/tests/test_scoring.py)
    assert result.completions == 1
    assert len(result.traces) == 1
    assert result.traces[0].status == "agent_timeout"
    assert len(world.evaluator.evaluated) == 1
    assert world.runtimes.created["s1"].stopped


async def _run(world: World, s: SessionSpec) -> Any:
    await world.pipeline.start_session(s)
    return await world.pipeline.wait_done(s.session_id)


@pytest.mark.parametrize("stage", [Stage.INIT, Stage.READY, Stage.RUNNING, Stage.POSTRUN])
async def test_cancel_in_any_stage_frees_the_slot_and_tears_down(stage: Stage) -> None:
    world = World(running_workers=1, ready_capacity=1, init_workers=1)
    # The cancelled stage's work would outlast the test's timeout: wait_done returning shows cancel cut it short.
    world.runtimes.start_s = 0.5 if stage is Stage.INIT else 0.0
    world.agents.run_s = 600.0 if stage is Stage.RUNNING else 0.0
    world.evaluator.evaluate_s = 600.0 if stage is Stage.POSTRUN else 0.0
    if stage is Stage.READY:
        # Hold the only RUNNING slot with a long session so s1 waits in READY.
        world.agents.run_s = 5.0
        await world.pipeline.start_session(spec("blocker"))
        await wait_stage(world, "blocker", Stage.RUNNING)
    await world.pipeline.start_session(spec("s1"))
    await wait_stage(world, "s1", stage)
    await until(lambda: "s1" in world.runtimes.created)  # INIT: cancel while the runtime boots
    state = world.pipeline.cancel_session("s1", "test")
    assert state.stage is stage
    result = await world.pipeline.wait_done("s1")
    assert result.status is TerminalStatus.CANCELLED
    assert result.reward == 0.0
    assert result.traces == []
    runtime = world.runtimes.created["s1"]
    assert runtime.stopped
    assert runtime.cancelled == (stage is not Stage.POSTRUN)  # POSTRUN stopped it before evaluating
    snapshot = {s.stage: s for s in world.pipeline.stage_snapshots()}
    blocker = 1 if stage is Stage.READY else 0
    assert snapshot[Stage.INIT].occupancy == 0
    assert snapshot[Stage.READY].occupancy == 0
    assert snapshot[Stage.RUNNING].occupancy == blocker
    assert snapshot[Stage.POSTRUN].occupancy == 0
    # Cancelling again, or cancelling a finished session, changes nothing.
    assert world.pipeline.cancel_session("s1").status is TerminalStatus.CANCELLED
    await world.pipeline.close(grace_s=5)


async def test_cancel_while_running_keeps_completion_count() -> None:
    world = World()
    world.agents.run_s = 3.0
    world.agents.calls = 2  # first call at 1 s
    await world.pipeline.start_session(spec())
    await wait_stage(world, "s1", Stage.RUNNING)
    await asyncio.sleep(1.3)
    world.pipeline.cancel_session("s1")
    result = await world.pipeline.wait_done("s1")
    assert result.status is TerminalStatus.CANCELLED
    assert result.completions == 1


async def test_session_deadline_before_running_is_infra_error() -> None:
    world = World(running_workers=1)
    world.agents.run_s = 3.0
    await world.pipeline.start_session(spec("blocker"))
    await world.pipeline.start_session(spec("late", deadline=time.time() + 0.5))
    result = await world.pipeline.wait_done("late")
    assert result.status is TerminalStatus.INFRA_ERROR
    assert "deadline" in result.error_message
    assert world.runtimes.created["late"].stopped
    await world.pipeline.close(grace_s=5)


async def test_evaluation_timeout_is_eval_timeout() -> None:
    world = World()
    world.evaluator.evaluate_s = 5.0
    result = await _run(world, spec(evaluator_options={"timeout_seconds": 0.2}))
    assert result.status is TerminalStatus.EVAL_TIMEOUT
    assert result.reward == 0.0
    assert world.evaluator.released == ["h-s1/1"]
    assert len(result.traces) == 2  # the agent's calls are still reconstructed


def _stage_at_prepare(world: World, session_id: str) -> list[Stage]:
    """Record the session's stage each time the evaluator's Prepare is called."""
    stages: list[Stage] = []
    prepare = world.evaluator.prepare

    async def recording(spec: SessionSpec, *, request_id: str, timeout_s: float) -> str:
        stages.append(world.pipeline.get_session(session_id)[0].stage)
        return await prepare(spec, request_id=request_id, timeout_s=timeout_s)

    world.evaluator.prepare = recording  # type: ignore[method-assign]
    return stages


async def test_clean_runtime_evaluator_is_prewarmed_during_run() -> None:
    world = World()
    world.agents.run_s = 0.6
    world.evaluator.prepare_s = 0.5
    stages = _stage_at_prepare(world, "s1")
    await world.pipeline.start_session(spec(evaluator_options={"clean_runtime": True}))
    result = await world.pipeline.wait_done("s1")
    assert result.status is TerminalStatus.RESOLVED
    # Prepare began while the agent ran (so POSTRUN does not wait for it), once.
    assert stages == [Stage.RUNNING]
    assert list(world.evaluator.prepared) == ["s1/1"]


async def test_without_clean_runtime_evaluator_is_prepared_in_postrun() -> None:
    world = World()
    world.agents.run_s = 0.3
    world.evaluator.prepare_s = 0.3
    stages = _stage_at_prepare(world, "s1")
    await world.pipeline.start_session(spec())
    await wait_stage(world, "s1", Stage.RUNNING)
    assert world.evaluator.prepared == {}
    result = await world.pipeline.wait_done("s1")
    assert result.status is TerminalStatus.RESOLVED
    assert stages == [Stage.POSTRUN]


async def test_no_evaluator_strategy_gives_unresolved_and_missing_client_gives_infra_error() -> None:
    world = World()
    result = await _run(world, spec(evaluator="none"))
    assert result.status is TerminalStatus.UNRESOLVED
    assert world.evaluator.prepared == {}

    world2 = World(with_evaluator=False)
    result2 = await _run(world2, spec())
    assert result2.status is TerminalStatus.INFRA_ERROR
    assert "evaluator" in result2.error_message


async def test_infra_failure_in_init_is_reported_and_torn_down() -> None:
    world = World()

    async def broken_open(*args: Any, **kwargs: Any) -> Any:
        raise Unavailable("proxy down", retry_after_s=0.01)

    world.proxy.open_session = broken_open  # type: ignore[method-assign]
    result = await _run(world, spec())
    assert result.status is TerminalStatus.INFRA_ERROR
    assert "proxy down" in result.error_message
    assert world.runtimes.created["s1"].stopped
    assert world.sink.results == [result]


async def test_unavailable_step_is_retried() -> None:
    world = World(step_retries=2)
    real = world.proxy.list_completions
    failures = [Unavailable("blip", retry_after_s=0.01)]

    async def flaky(session_id: str, *, timeout_s: float) -> Any:
        if failures:
            raise failures.pop()
        return await real(session_id, timeout_s=timeout_s)

    world.proxy.list_completions = flaky  # type: ignore[method-assign]
    result = await _run(world, spec())
    assert result.status is TerminalStatus.RESOLVED
    assert result.completions == 2


async def test_priority_orders_the_init_queue() -> None:
    world = World(init_workers=1)
    world.runtimes.start_s = 0.05
    await world.pipeline.start_session(spec("first"))
    for name, prio in [("low", 0), ("high", 5), ("mid", 2)]:
        await world.pipeline.start_session(spec(name, priority=prio))
    for name in ("first", "low", "high", "mid"):
        await world.pipeline.wait_done(name)
    assert world.agents.ran == ["first", "high", "mid", "low"]


async def test_ready_buffer_is_bounded() -> None:
    world = World(init_workers=4, ready_capacity=1, running_workers=1)
    world.agents.run_s = 0.5
    for i in range(4):
        await world.pipeline.start_session(spec(f"s{i}"))
    await asyncio.sleep(0.2)
    snap = {s.stage: s for s in world.pipeline.stage_snapshots()}
    assert snap[Stage.RUNNING].occupancy == 1
    assert snap[Stage.READY].occupancy == 1
    assert snap[Stage.READY].queue_length == 2  # prepared, waiting in INIT for buffer space
    await world.pipeline.close(grace_s=5)


async def test_postrun_backlog_refuses_admission_with_retry() -> None:
    world = World(postrun_workers=1, postrun_backlog_limit=1, running_workers=8)
    world.evaluator.evaluate_s = 1.0
    for i in range(4):
        await world.pipeline.start_session(spec(f"s{i}"))
    await until(lambda: world.pipeline.stage_snapshots()[3].queue_length >= 2)
    with pytest.raises(GatewayBusy) as info:
        await world.pipeline.start_session(spec("refused"))
    assert info.value.retry_after_s is not None
    assert info.value.retry_after_s >= 0.5
    assert info.value.details["stage"] == "postrun"
    assert world.pipeline.capacity().available == 0
    await world.pipeline.close(grace_s=10)


async def test_capacity_limit_and_draining() -> None:
    world = World(max_sessions=2)
    world.agents.run_s = 1.0
    await world.pipeline.start_session(spec("a"))
    await world.pipeline.start_session(spec("b"))
    cap = world.pipeline.capacity()
    assert (cap.capacity, cap.active, cap.available) == (2, 2, 0)
    with pytest.raises(GatewayBusy):
        await world.pipeline.start_session(spec("c"))
    await world.pipeline.close(grace_s=5)
    with pytest.raises(GatewayDraining):
        await world.pipeline.start_session(spec("d"))
    assert world.pipeline.get_session("a")[0].status is TerminalStatus.CANCELLED


async def test_watch_include_current_and_filters() -> None:
    world = World()
    await _run(world, spec("a"))
    sub = world.pipeline.watch(task_id="t1", include_current=True)
    async with asyncio.timeout(1):
        first = await anext(aiter(sub))
    sub.close()
    assert first.previous is None
    assert first.state.session_id == "a"
    assert first.result is not None
    other = world.pipeline.watch(task_id="other", include_current=True)
    await _run(world, spec("b"))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await anext(aiter(other))
    other.close()


async def test_slow_watcher_is_disconnected() -> None:
    world = World(watch_buffer=2)
    sub = world.pipeline.watch()
    await _run(world, spec("a"))  # five events into a buffer of two
    received = []

    async def drain() -> None:
        async for event in sub:
            received.append(event)

    with pytest.raises(Unavailable):
        await drain()
    assert len(received) == 2
    sub.close()


async def test_results_are_evicted_beyond_retention() -> None:
    world = World(retained_results=2)
    for name in ("a", "b", "c"):
        await _run(world, spec(name))
    with pytest.raises(SessionNotFound):
        world.pipeline.get_session("a")
    assert world.pipeline.get_session("c")[1] is not None


async def test_retried_attempt_records_into_a_fresh_proxy_session() -> None:
    world = World()
    # The failed first attempt left a closed proxy session with one call behind.
    world.proxy.record_call("s1")
    world.proxy.closed.add("s1")
    await world.pipeline.start_session(spec(attempt=2))
    result = await world.pipeline.wait_done("s1")

    assert result.status is TerminalStatus.RESOLVED
    assert result.completions == 2
    assert "s1~attempt2" in world.proxy.opened
    assert "s1~attempt2" in world.proxy.closed
    assert [t.call_ids for t in result.traces] == [["s1~attempt2-0"], ["s1~attempt2-1"]]
    # The records and traces belong to the logical session, not to the attempt's proxy session.
    assert {t.session_id for t in result.traces} == {"s1"}
    assert len(world.proxy.calls["s1"]) == 1
