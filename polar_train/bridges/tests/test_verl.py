"""The verl bridge without verl: conversion, task building, the session wait, and the lazy verl import."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import math
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from polar.common.v1 import session_pb2, task_pb2, trace_pb2

from polar_core.errors import InvalidArgument
from polar_train.bridges import verl as bridge
from polar_train.bridges.verl_convert import convert_session, trace_problem

HAS_VERL = importlib.util.find_spec("verl") is not None


def _trace(index: int, prompt: list[int], response: list[int], mask: list[int], **kw: Any) -> trace_pb2.Trace:
    logprobs = kw.pop("logprobs", [-0.5 - i / 10 if m else 0.0 for i, m in enumerate(mask)])
    return trace_pb2.Trace(
        trace_index=index,
        prompt_token_ids=prompt,
        response_token_ids=response,
        loss_mask=mask,
        response_logprobs=logprobs,
        policy_versions=kw.pop("versions", ["3"]),
        **kw,
    )


def _result(*traces: trace_pb2.Trace, status: str = "resolved", reward: float = 1.0, calls: int = 2) -> Any:
    result = session_pb2.SessionResult(
        session_id="s-1", task_id="t-1", status=status, reward=reward, traces=list(traces)
    )
    result.statistics.completions = calls
    return result


def _convert(result: Any, **kw: Any) -> Any:
    options: dict[str, Any] = {"prompt_length": 16, "response_length": 16, "fallback_prompt_ids": [7, 8]}
    options.update(kw)
    return convert_session(result, **options)


def test_a_trace_becomes_verls_fields() -> None:
    trace = _trace(0, [1, 2, 3], [10, 11, 12, 13, 14], [1, 1, 0, 0, 1], logprobs=[-0.1, -0.2, math.nan, 0.0, -0.3])
    sample = _convert(_result(trace, reward=0.75))
    assert sample.prompt_ids == [1, 2, 3]
    assert sample.response_ids == [10, 11, 12, 13, 14]
    assert sample.response_mask == [1, 1, 0, 0, 1]
    # A placeholder at a mask-0 position becomes 0.0: verl multiplies by the mask, and nan * 0 is nan.
    assert sample.response_logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert sample.reward == 0.75
    assert sample.num_turns == 4
    assert not sample.failed
    assert sample.policy_versions == ("3",)
    extra = sample.extra_fields()
    assert extra["polar_session_id"] == "s-1"
    assert extra["polar_task_id"] == "t-1"
    assert extra["polar_status"] == "resolved"
    assert extra["polar_trace_index"] == 0


@pytest.mark.parametrize(("rule", "chosen", "dropped_tokens"), [("longest", 0, 1), ("last", 1, 3)])
def test_a_session_split_into_traces_gives_one_row(rule: str, chosen: int, dropped_tokens: int) -> None:
    long = _trace(0, [1, 2], [10, 11, 12], [1, 1, 1])
    short = _trace(1, [5], [20, 21], [1, 0])
    sample = _convert(_result(long, short), multi_trace=rule)
    assert sample.trace_index == chosen
    assert sample.traces == 2
    assert sample.dropped_traces == 1
    assert sample.dropped_tokens == dropped_tokens


def test_longest_ties_go_to_the_later_trace() -> None:
    sample = _convert(_result(_trace(0, [1], [2], [1]), _trace(1, [1], [3], [1])))
    assert sample.trace_index == 1


@pytest.mark.parametrize("status", ["infra_error", "cancelled"])
def test_a_failed_session_keeps_its_row_with_reward_0_and_no_mask(status: str) -> None:
    trace = _trace(0, [1, 2], [10, 11], [1, 1])
    sample = _convert(_result(trace, status=status, reward=1.0))
    assert sample.failed
    assert sample.reward == 0.0
    assert sample.prompt_ids == [1, 2]
    assert sample.response_ids == [10, 11]
    assert sample.response_mask == [0, 0]
    assert sample.response_logprobs == [0.0, 0.0]


def test_a_session_without_a_trace_or_a_result_gets_the_fallback_prompt() -> None:
    for result in (None, _result(status="infra_error", calls=0)):
        sample = _convert(result, pad_token_id=9, error="timed out")
        assert sample.failed
        assert sample.reward == 0.0
        assert sample.prompt_ids == [7, 8]
        assert sample.response_ids == [9]
        assert sample.response_mask == [0]
    assert _convert(None, error="timed out").status == "missing"
    assert _convert(None, fallback_prompt_ids=[], pad_token_id=4).prompt_ids == [4]


@pytest.mark.parametrize(
    ("trace", "problem"),
    [
        (_trace(0, [1], [2, 3], [1]), "loss_mask has 1 entries for 2 response tokens"),
        (_trace(0, [1], [2, 3], [1, 1], logprobs=[-1.0]), "response_logprobs has 1 entries for 2 response tokens"),
        (_trace(0, [1], [2], [2]), "loss_mask holds values other than 0 and 1"),
        (_trace(0, [1], [2], [1], logprobs=[math.inf]), "a sampled token's log-probability is not finite"),
        (_trace(0, [], [2], [1]), "no prompt tokens"),
    ],
)
def test_malformed_traces_are_refused_and_counted(trace: trace_pb2.Trace, problem: str) -> None:
    assert trace_problem(trace) == problem
    sample = _convert(_result(trace))
    assert sample.failed
    assert sample.refused_traces == 1
    assert sample.reward == 0.0
    assert not any(sample.response_mask)
    # A good trace beside it is used; the refused one is still counted.
    good = _trace(5, [1], [2, 3], [1, 1])
    sample = _convert(_result(trace, good))
    assert not sample.failed
    assert sample.trace_index == 5
    assert sample.refused_traces == 1


def test_long_sequences_are_cut_to_verls_lengths_and_counted() -> None:
    trace = _trace(0, list(range(1, 11)), list(range(20, 30)), [1] * 10)
    sample = _convert(_result(trace), prompt_length=4, response_length=6)
    assert sample.prompt_ids == [7, 8, 9, 10]  # the prompt keeps its end
    assert sample.response_ids == list(range(20, 26))
    assert len(sample.response_mask) == 6
    assert len(sample.response_logprobs) == 6
    assert sample.truncated_tokens == 10


def test_session_task_takes_the_template_the_instruction_and_a_fresh_id(tmp_path: Any) -> None:
    template = {"instruction": "template", "num_samples": 8, "harness": {"name": "command", "argv": ["true"]}}
    settings = bridge.PolarLoopSettings(rollout_address="x:1", task=template)
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "from the prompt"}]
    task = bridge.session_task(settings, {}, prompt, task_id="verl-1")
    assert (task.task_id, task.num_samples, task.instruction) == ("verl-1", 1, "from the prompt")
    assert bridge.session_task(settings, {"instruction": "own"}, prompt, task_id="a").instruction == "own"
    assert bridge.session_task(settings, None, None, task_id="a").instruction == "template"
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert bridge.session_task(settings, None, parts, task_id="a").instruction == "ab"
    # A sample's own task (a mapping or a TASK.yaml path) replaces the template.
    own = {"instruction": "own task", "harness": {"name": "command", "argv": ["false"]}}
    task = bridge.session_task(settings, {"polar_task": own}, None, task_id="b")
    assert task.harness.options["argv"] == ["false"]
    assert task.instruction == "own task"
    path = tmp_path / "TASK.yaml"
    path.write_text("instruction: from a file\nharness:\n  name: command\n  argv: [echo]\n")
    assert bridge.session_task(settings, {"polar_task": str(path)}, None, task_id="c").instruction == "from a file"
    with pytest.raises(InvalidArgument, match="no Polar task"):
        bridge.session_task(bridge.PolarLoopSettings(rollout_address="x:1"), {}, None, task_id="d")


def test_settings_merge_the_config_section_under_the_loop_entry() -> None:
    settings = bridge.PolarLoopSettings.merged(
        {"rollout_address": "a:1", "token": "t", "multi_trace": "last"}, {"rollout_address": "b:2"}
    )
    assert (settings.rollout_address, settings.token, settings.multi_trace) == ("b:2", "t", "last")
    assert settings.wait_s == 900.0
    with pytest.raises(ValueError, match="multi_trace"):
        bridge.PolarLoopSettings(multi_trace="first")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tasks"):
        bridge.PolarLoopSettings.merged({"tasks": 1})


@dataclasses.dataclass
class _FakeClient:
    """What :func:`run_session` uses of ``RolloutClient``: submit, watch and cancel."""

    results: list[Any]
    hang: bool = False
    watch_error: grpc.StatusCode | None = None
    cancelled: list[str] = dataclasses.field(default_factory=list)
    submitted: list[task_pb2.Task] = dataclasses.field(default_factory=list)

    async def submit(self, task: task_pb2.Task, *, task_timeout_s: float | None = None) -> Any:
        self.submitted.append(task)
        return type("Reply", (), {"task_id": task.task_id})()

    async def watch(self, task_id: str) -> AsyncIterator[Any]:
        if self.watch_error is not None:
            raise grpc.aio.AioRpcError(self.watch_error, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone", None)
        if self.hang:
            await asyncio.sleep(60)
        for result in self.results:
            yield result

    async def cancel(self, task_id: str, reason: str = "") -> Any:
        self.cancelled.append(task_id)


async def test_run_session_returns_the_result_or_why_none_came() -> None:
    settings = bridge.PolarLoopSettings(rollout_address="x:1", task_timeout_s=1, wait_timeout_s=0.05)
    task = task_pb2.Task(task_id="t-1")
    result = _result(_trace(0, [1], [2], [1]))
    assert await bridge.run_session(_FakeClient([result]), task, settings) == (result, "")  # type: ignore[arg-type]
    assert await bridge.run_session(_FakeClient([]), task, settings) == (  # type: ignore[arg-type]
        None,
        "the task ended without a session result",
    )
    hanging = _FakeClient([], hang=True)
    none, why = await bridge.run_session(hanging, task, settings)  # type: ignore[arg-type]
    assert none is None
    assert "no session result within 0.05 s" in why
    assert hanging.cancelled == ["t-1"]
    broken = _FakeClient([], watch_error=grpc.StatusCode.NOT_FOUND)
    none, why = await bridge.run_session(broken, task, settings)  # type: ignore[arg-type]
    assert none is None
    assert "NOT_FOUND" in why


def test_the_output_is_built_with_verls_field_names() -> None:
    @dataclasses.dataclass
    class StandIn:  # the fields of verl's AgentLoopOutput that the bridge fills
        prompt_ids: list[int]
        response_ids: list[int]
        response_mask: list[int]
        response_logprobs: list[float]
        reward_score: float
        num_turns: int
        metrics: dict[str, float]
        extra_fields: dict[str, Any]

    sample = _convert(_result(_trace(0, [1], [2, 3], [1, 0]), reward=0.5))
    output = bridge.to_agent_loop_output(sample, 1.5, StandIn)
    assert (output.prompt_ids, output.response_ids, output.response_mask) == ([1], [2, 3], [1, 0])
    assert output.reward_score == 0.5
    assert output.num_turns == 4
    assert output.metrics == {"generate_sequences": 1.5}
    assert output.extra_fields["turn_scores"] == []
    assert output.extra_fields["polar_traces"] == 1


def test_importing_the_bridge_does_not_import_verl() -> None:
    code = "import sys, polar_train.bridges.verl; assert 'verl' not in sys.modules; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.skipif(HAS_VERL, reason="verl is installed here (its test is integration_tests/test_verl_bridge.py)")
def test_asking_for_the_loop_without_verl_names_what_is_missing() -> None:
    with pytest.raises(ImportError, match="verl"):
        bridge.register_polar_loop()
    with pytest.raises(AttributeError):
        bridge.NoSuchThing  # noqa: B018
