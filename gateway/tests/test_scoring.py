"""POSTRUN scoring over fakes: timed-out agents scored (or not, by option), traces before evaluation for an
evaluator that needs them, per-trace rewards on the traces, and what the agent did kept on the result."""

from __future__ import annotations

from typing import Any

from gateway.core import SessionPipeline
from gateway.kept import cap_patch, log_tail
from gateway.models import Artifacts, EvaluatorConfig, HarnessConfig, PipelineConfig, SessionSpec
from gateway.testing import FakeAgentRunner, FakeEvaluator, FakeProxy, FakeReconstructor, FakeRuntimeFactory
from polar_core.records import TerminalStatus


def _pipeline(evaluator: FakeEvaluator, agents_run_s: float = 0.0, **config: Any) -> SessionPipeline:
    proxy = FakeProxy()
    agents = FakeAgentRunner(proxy, run_s=agents_run_s, calls=3)
    return SessionPipeline(
        PipelineConfig(step_retries=0, **config),
        gateway_id="gw",
        runtimes=FakeRuntimeFactory(),
        agents=agents,
        proxy=proxy,
        reconstructor=FakeReconstructor(),
        evaluator=evaluator,
    )


def _spec(*, options: dict[str, Any] | None = None, agent_timeout_s: float = 0.0) -> SessionSpec:
    return SessionSpec(
        session_id="s",
        task_id="t",
        harness=HarnessConfig("fake"),
        evaluator=EvaluatorConfig("script", options or {}),
        agent_timeout_s=agent_timeout_s,
    )


async def _run(pipeline: SessionPipeline, spec: SessionSpec) -> Any:
    await pipeline.start_session(spec)
    return await pipeline.wait_done(spec.session_id)


async def test_a_timed_out_agent_is_scored_and_its_patch_kept() -> None:
    evaluator = FakeEvaluator(reward=1.0)
    result = await _run(_pipeline(evaluator, agents_run_s=4.0), _spec(agent_timeout_s=1.5))
    assert result.status is TerminalStatus.AGENT_TIMEOUT
    assert result.reward == 1.0
    assert evaluator.artifacts[0].patch == b"diff --git a/x b/x\n"
    assert result.artifacts.patch == b"diff --git a/x b/x\n"
    assert all(t.reward == 1.0 and t.status == "agent_timeout" for t in result.traces)


async def test_a_task_may_opt_out_of_scoring_timeouts() -> None:
    evaluator = FakeEvaluator(reward=1.0)
    spec = _spec(options={"score_on_timeout": False}, agent_timeout_s=1.5)
    result = await _run(_pipeline(evaluator, agents_run_s=4.0), spec)
    assert result.status is TerminalStatus.AGENT_TIMEOUT
    assert result.reward == 0.0
    assert evaluator.evaluated == []
    assert result.artifacts.patch  # the work is still kept
    assert all(t.reward == 0.0 for t in result.traces)


async def test_an_evaluator_that_needs_traces_gets_them_and_rewards_each() -> None:
    def per_trace(artifacts: Artifacts) -> tuple[float, ...]:
        return tuple(0.5 * (t.trace_index + 1) for t in artifacts.traces)

    evaluator = FakeEvaluator(reward=1.0, trace_rewards=per_trace)
    result = await _run(_pipeline(evaluator), _spec(options={"needs_traces": True}))
    assert result.status is TerminalStatus.RESOLVED
    assert len(evaluator.artifacts[0].traces) == 3
    assert [t.reward for t in result.traces] == [0.5, 1.0, 1.5]
    assert all(t.status == "resolved" for t in result.traces)  # the provisional status is replaced


async def test_an_evaluator_without_traces_gets_none() -> None:
    evaluator = FakeEvaluator(reward=1.0)
    result = await _run(_pipeline(evaluator), _spec())
    assert evaluator.artifacts[0].traces == ()
    assert [t.reward for t in result.traces] == [1.0, 1.0, 1.0]


async def test_a_trace_reward_count_that_does_not_match_is_an_infra_error() -> None:
    evaluator = FakeEvaluator(reward=1.0, trace_rewards=lambda a: (1.0,))
    result = await _run(_pipeline(evaluator), _spec(options={"needs_traces": True}))
    assert result.status is TerminalStatus.INFRA_ERROR
    assert "1 trace rewards for 3 traces" in result.error_message
    assert result.reward == 0.0
    assert all(t.reward == 0.0 and t.status == "infra_error" for t in result.traces)


async def test_kept_logs_and_patch_are_capped() -> None:
    evaluator = FakeEvaluator(reward=1.0)
    result = await _run(_pipeline(evaluator, result_patch_limit_bytes=4, result_log_limit_bytes=2), _spec())
    assert result.artifacts.patch == b"diff"
    assert result.artifacts.patch_truncated
    assert result.artifacts.harness_stdout == "ne"  # the tail of "done"
    assert result.artifacts.harness_log_truncated


def test_caps() -> None:
    assert cap_patch(None, 10) == (b"", False)
    assert cap_patch(b"abc", 3) == (b"abc", False)
    assert log_tail("ab€", 2) == ("", True)  # a split character is dropped, never garbled
    assert log_tail("ab€", 3) == ("€", True)
