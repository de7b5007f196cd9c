"""A host whose disk cannot hold a session's quota: for now (an outage, run again later) or at all (infra)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.core import SessionPipeline
from gateway.models import EvaluatorConfig, HarnessConfig, PipelineConfig, SessionSpec
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


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        (DiskSpaceHeld("the disk quota (4096 MiB) is larger than the free space for sessions on /x"), True),
        (DiskSpaceUnavailable("the disk quota (4096 MiB) is larger than the free space for sessions on /x"), False),
    ],
)
async def test_a_quota_the_disk_holds_only_later_is_an_outage(error: Exception, outage: bool) -> None:
    proxy = FakeProxy()
    runtimes = FakeRuntimeFactory(start_error=error)
    sink = RecordingSink()
    pipeline = SessionPipeline(
        PipelineConfig(step_retries=1),
        gateway_id="gw-test",
        runtimes=runtimes,
        agents=FakeAgentRunner(proxy),
        proxy=proxy,
        reconstructor=FakeReconstructor(),
        evaluator=FakeEvaluator(),
        sink=sink,
    )
    spec = SessionSpec(
        session_id="s1",
        task_id="t1",
        harness=HarnessConfig("fake"),
        instruction="fix it",
        evaluator=EvaluatorConfig("script", {}),
    )
    await pipeline.start_session(spec)
    result = await asyncio.wait_for(pipeline.wait_done("s1"), 30)
    assert result.status is TerminalStatus.INFRA_ERROR
    assert "larger than the free space" in result.error_message
    # Held space: not the session's failure, so the rollout server runs it again without using an attempt.
    assert result.dependency_unavailable is outage
    assert [r.session_id for r in sink.results] == ["s1"]
    await pipeline.close(grace_s=5)
