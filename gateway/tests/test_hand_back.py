"""A gateway that goes away hands its unfinished sessions back as an outage; one that drains lets them finish; a
session whose disk quota the host can hold only later is handed back too."""

from __future__ import annotations

import asyncio

import pytest

from gateway.core import SessionPipeline
from gateway.models import EvaluatorConfig, HarnessConfig, PipelineConfig, SessionSpec, Stage
from gateway.testing import (
    FakeAgentRunner,
    FakeEvaluator,
    FakeProxy,
    FakeReconstructor,
    FakeRuntimeFactory,
    RecordingSink,
)
from polar_core.records import TerminalStatus
from runtimes.errors import DiskSpaceHeld, DiskSpaceUnavailable


def _pipeline(run_s: float, runtimes: FakeRuntimeFactory | None = None) -> tuple[SessionPipeline, RecordingSink]:
    proxy = FakeProxy()
    agents = FakeAgentRunner(proxy)
    agents.run_s = run_s
    sink = RecordingSink()
    pipeline = SessionPipeline(
        PipelineConfig(step_retries=1),
        gateway_id="gw-test",
        runtimes=runtimes or FakeRuntimeFactory(),
        agents=agents,
        proxy=proxy,
        reconstructor=FakeReconstructor(),
        evaluator=FakeEvaluator(),
        sink=sink,
    )
    return pipeline, sink


def _spec(session_id: str) -> SessionSpec:
    return SessionSpec(
        session_id=session_id,
        task_id="t1",
        harness=HarnessConfig("fake"),
        instruction="fix it",
        evaluator=EvaluatorConfig("script", {}),
    )


async def _running(pipeline: SessionPipeline, session_id: str) -> None:
    while True:
        if pipeline.get_session(session_id)[0].stage is Stage.RUNNING:
            return
        await asyncio.sleep(0.01)


async def test_shutdown_hands_sessions_back_as_an_outage() -> None:
    pipeline, sink = _pipeline(run_s=30.0)
    await pipeline.start_session(_spec("s1"))
    await asyncio.wait_for(_running(pipeline, "s1"), 10)
    await pipeline.close(grace_s=5, hand_back=True)
    state, result = pipeline.get_session("s1")
    assert state.status is TerminalStatus.INFRA_ERROR
    assert result is not None
    assert result.dependency_unavailable  # not counted against the session's attempts
    assert "handed back" in result.error_message
    assert [r.session_id for r in sink.results] == ["s1"]


async def test_plain_close_still_cancels() -> None:
    pipeline, _ = _pipeline(run_s=30.0)
    await pipeline.start_session(_spec("s1"))
    await asyncio.wait_for(_running(pipeline, "s1"), 10)
    await pipeline.close(grace_s=5)
    assert pipeline.get_session("s1")[0].status is TerminalStatus.CANCELLED


async def test_drain_lets_running_sessions_finish() -> None:
    pipeline, sink = _pipeline(run_s=0.3)
    await pipeline.start_session(_spec("s1"))
    pipeline.drain()
    assert await pipeline.wait_idle(30.0) == 0
    await pipeline.close(grace_s=5, hand_back=True)
    state, result = pipeline.get_session("s1")
    assert result is not None
    assert not result.dependency_unavailable
    assert state.status is not TerminalStatus.INFRA_ERROR
    assert [r.session_id for r in sink.results] == ["s1"]


async def test_a_session_that_ends_while_the_gateway_goes_away_is_handed_back() -> None:
    # A signal to the whole job (Slurm's scancel) also reaches the agent: whatever the session ends with after
    # the gateway started going away is not scored.
    pipeline, sink = _pipeline(run_s=0.3)
    await pipeline.start_session(_spec("s1"))
    await asyncio.wait_for(_running(pipeline, "s1"), 10)
    pipeline.hand_back_all()
    result = await asyncio.wait_for(pipeline.wait_done("s1"), 30)
    assert result.status is TerminalStatus.INFRA_ERROR
    assert result.dependency_unavailable
    assert "handed back" in result.error_message
    assert [r.session_id for r in sink.results] == ["s1"]
    await pipeline.close(grace_s=5, hand_back=True)


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        (DiskSpaceHeld("the disk quota (4096 MiB) is larger than the free space for sessions on /x"), True),
        (DiskSpaceUnavailable("the disk quota (4096 MiB) is larger than the free space for sessions on /x"), False),
    ],
)
async def test_a_quota_the_disk_holds_only_later_is_an_outage(error: Exception, outage: bool) -> None:
    pipeline, sink = _pipeline(run_s=0.0, runtimes=FakeRuntimeFactory(start_error=error))
    await pipeline.start_session(_spec("s1"))
    result = await asyncio.wait_for(pipeline.wait_done("s1"), 30)
    assert result.status is TerminalStatus.INFRA_ERROR
    assert "larger than the free space" in result.error_message
    # Held space: not the session's failure, so the rollout server runs it again without using an attempt.
    assert result.dependency_unavailable is outage
    assert [r.session_id for r in sink.results] == ["s1"]
    await pipeline.close(grace_s=5)
