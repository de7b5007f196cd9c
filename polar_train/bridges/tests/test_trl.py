"""The TRL bridge without TRL or a server: rows from session results, configuration checks, policy sync."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from polar.common.v1 import session_pb2, task_pb2, trace_pb2

from polar_core.errors import FailedPrecondition, InvalidArgument
from polar_train.bridges.trl import (
    REWARD_KEY,
    PolarRollout,
    TrlBridgeSettings,
    polar_reward,
    polar_rollout_func,
)
from polar_train.bridges.trl_rows import group_rows

END = 99


def _trace(
    index: int = 0,
    *,
    response: list[int] | None = None,
    mask: list[int] | None = None,
    logprobs: list[float] | None = None,
    versions: tuple[str, ...] = ("0",),
) -> trace_pb2.Trace:
    response = response if response is not None else [5, 6, 7]
    return trace_pb2.Trace(
        session_id="s",
        task_id="t",
        trace_index=index,
        prompt_token_ids=[1, 2, 3 + index],
        response_token_ids=response,
        loss_mask=mask if mask is not None else [1] * len(response),
        response_logprobs=logprobs if logprobs is not None else [-0.5] * len(response),
        policy_versions=list(versions),
    )


def _result(
    sample: int, *traces: trace_pb2.Trace, status: str = "unresolved", reward: float = 0.25
) -> session_pb2.SessionResult:
    return session_pb2.SessionResult(
        session_id=f"t-{sample}", task_id="t", status=status, reward=reward, sample_index=sample, traces=traces
    )


def _rows(results: list[session_pb2.SessionResult], **kwargs: Any) -> Any:
    options: dict[str, Any] = {"group_size": len(results), "fallback_prompt_ids": [1], "end_token_id": END}
    return group_rows(results, **(options | kwargs))


def test_a_session_becomes_one_row_with_its_trace_mask_logprobs_and_reward() -> None:
    tool = _trace(response=[5, 6, 7, 8], mask=[1, 0, 0, 1], logprobs=[-0.1, math.nan, math.inf, -0.4])
    group = _rows([_result(1, _trace(), reward=0.5), _result(0, tool, reward=0.75)])
    first, second = group.rows  # in sample order
    assert (first.prompt_ids, first.completion_ids, first.env_mask) == ([1, 2, 3], [5, 6, 7, 8], [1, 0, 0, 1])
    assert first.logprobs == [-0.1, 0.0, 0.0, -0.4]  # placeholders under mask 0 never reach TRL
    assert (first.reward, second.reward, first.session_id) == (0.75, 0.5, "t-0")
    assert (group.failed_sessions, group.refused_traces, group.extra_traces) == (0, 0, 0)


def test_a_multi_trace_session_gives_its_last_or_its_longest_trace_and_counts_the_rest() -> None:
    long_first = _trace(0, response=[5, 6, 7, 8, 9])
    short_last = _trace(1, response=[5, 6], versions=("2", "3"))
    last = _rows([_result(0, long_first, short_last)])
    assert last.rows[0].completion_ids == [5, 6]
    assert last.rows[0].policy_version == 2  # the oldest call of the chosen trace
    assert last.extra_traces == 1
    longest = _rows([_result(0, long_first, short_last)], multi_trace="longest")
    assert longest.rows[0].completion_ids == [5, 6, 7, 8, 9]


def test_failed_and_missing_sessions_are_masked_placeholders_with_the_failed_reward() -> None:
    results = [_result(0, _trace(), status="infra_error", reward=0.9), _result(1, _trace(mask=[0, 0, 0]))]
    group = _rows(results, group_size=3, fallback_prompt_ids=[7, 8])
    assert [r.status for r in group.rows] == ["infra_error", "unresolved", "missing"]
    for row in group.rows:
        assert (row.prompt_ids, row.completion_ids, row.env_mask, row.reward) == ([7, 8], [END], [0], 0.0)
        assert not row.trainable
    assert group.failed_sessions == 3
    unscored = _rows(results, group_size=2, failed_reward=None)
    assert [r.reward for r in unscored.rows] == [None, None]


def test_a_trace_whose_mask_or_logprobs_differ_in_length_is_refused_and_counted() -> None:
    bad_mask = _trace(0, mask=[1, 1])
    bad_logprobs = _trace(1, logprobs=[-0.1])
    group = _rows([_result(0, bad_mask, bad_logprobs), _result(1, bad_mask, _trace(2))])
    assert group.refused_traces == 3
    assert group.rows[0].status == "refused"
    assert group.rows[0].env_mask == [0]
    assert group.rows[1].completion_ids == [5, 6, 7]  # the session's consistent trace is kept
    assert group.failed_sessions == 1


def test_a_repeated_result_for_a_session_keeps_the_last_and_extra_samples_are_cut() -> None:
    results = [_result(0, _trace(), reward=0.1), _result(0, _trace(), reward=0.2), _result(1, _trace())]
    group = _rows(results, group_size=1)
    assert [r.reward for r in group.rows] == [0.2]


class _Template:
    def __init__(self, samples: int | None = None) -> None:
        self.samples = samples
        self.instructions: list[str | None] = []

    def task(self, task_id: str, *, group_size: int, instruction: str | None = None) -> task_pb2.Task:
        self.instructions.append(instruction)
        n = group_size if self.samples is None else self.samples
        return task_pb2.Task(task_id=task_id, instruction=instruction or "", num_samples=n)


def _args(**overrides: Any) -> Any:
    values = {"num_generations": 2, "num_generations_eval": None, "use_vllm": False} | overrides
    return types.SimpleNamespace(**values)


def _settings(tmp_path: Path, **overrides: Any) -> TrlBridgeSettings:
    return TrlBridgeSettings(rollout_address="unused:1", checkpoint_dir=tmp_path / "ckpt", run_id="r", **overrides)


@pytest.mark.parametrize(
    ("args", "template", "message"),
    [
        (_args(num_generations=1), _Template(), "group of size 1"),
        (_args(num_generations_eval=1), _Template(), "group of size 1"),
        (_args(use_vllm=True), _Template(), "use_vllm"),
        (_args(), _Template(samples=0), "0 samples per task"),
        (_args(), _Template(samples=8), "8 samples per task"),
    ],
)
def test_bad_configuration_is_refused_before_training(
    tmp_path: Path, args: Any, template: _Template, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        polar_rollout_func(_settings(tmp_path), template, args=args)


class _FakeClient:
    """The rollout server as the bridge sees it: each task's sessions answer with a reward per sample index."""

    def __init__(self, version: int = 3, complete: bool = True) -> None:
        self.version = version
        self.complete = complete
        self.tasks: list[task_pb2.Task] = []
        self.updates: list[tuple[int, str]] = []
        self.closed = False

    async def submit(self, task: task_pb2.Task, *, task_timeout_s: float | None = None) -> Any:
        self.tasks.append(task)
        return types.SimpleNamespace(task_id=task.task_id, already_existed=False)

    async def watch(self, task_id: str) -> AsyncIterator[session_pb2.SessionResult]:
        task = next(t for t in self.tasks if t.task_id == task_id)
        for i in range(task.num_samples):
            trace = _trace(versions=(str(self.version),))
            yield _result(i, trace, reward=0.1 * (i + 1), status="infra_error" if i == 2 else "unresolved")

    async def cancel(self, task_id: str, reason: str = "") -> Any:
        return None

    async def get_policy(self) -> Any:
        return types.SimpleNamespace(policy=types.SimpleNamespace(version=self.version))

    async def update_policy(self, version: int, weights_path: Any, *, pause_mode: Any = "drain") -> Any:
        self.updates.append((version, str(weights_path)))
        if self.complete:
            self.version = version
        failed = () if self.complete else (types.SimpleNamespace(address="proxy:1", error="load failed"),)
        return types.SimpleNamespace(complete=self.complete, failed=failed)

    async def close(self) -> None:
        self.closed = True


class _Saveable:
    def save_pretrained(self, directory: Path) -> None:
        (Path(directory) / "config.json").write_text("{}", encoding="utf-8")


class _Tokenizer(_Saveable):
    eos_token_id = END
    pad_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [len(text)]}


def _trainer(step: int = 0, *, generations: int = 3) -> Any:
    accelerator = types.SimpleNamespace(
        is_main_process=True, unwrap_model=lambda model: model, wait_for_everyone=lambda: None
    )
    return types.SimpleNamespace(
        model=types.SimpleNamespace(training=True, save_pretrained=_Saveable().save_pretrained),
        num_generations=generations,
        num_generations_eval=generations,
        processing_class=_Tokenizer(),
        state=types.SimpleNamespace(global_step=step),
        accelerator=accelerator,
    )


def _bridge(tmp_path: Path, client: _FakeClient, **overrides: Any) -> PolarRollout:
    return polar_rollout_func(
        _settings(tmp_path, **overrides), _Template(), args=_args(num_generations=3), client_factory=lambda: client
    )


def test_one_call_submits_one_task_per_group_and_returns_trl_rows(tmp_path: Path) -> None:
    client = _FakeClient()
    bridge = _bridge(tmp_path, client)
    try:
        conversation = [{"role": "system", "content": "s"}, {"role": "user", "content": "b"}]
        out = bridge(["a"] * 3 + [conversation] * 3, _trainer())
    finally:
        bridge.close()
    assert [(t.instruction, t.num_samples) for t in client.tasks] == [("a", 3), ("b", 3)]
    assert [t.task_id for t in client.tasks] == ["r-p0-s00000-c0000-g0", "r-p0-s00000-c0000-g1"]
    assert len(out["prompt_ids"]) == len(out["completion_ids"]) == len(out["logprobs"]) == len(out["env_mask"]) == 6
    assert out[REWARD_KEY] == pytest.approx([0.1, 0.2, 0.0, 0.1, 0.2, 0.0])  # sample 2 failed: reward 0, masked
    assert out["env_mask"][2] == [0]
    assert out["polar_status"][2] == "infra_error"
    assert (out["polar_failed_sessions"], out["polar_policy_version"]) == (2, 3)
    assert bridge.stats.sessions == 6
    assert client.closed


def test_prompts_that_are_not_groups_of_num_generations_are_refused(tmp_path: Path) -> None:
    bridge = _bridge(tmp_path, _FakeClient())
    try:
        with pytest.raises(InvalidArgument, match="not one prompt repeated"):
            bridge(["a", "a", "b"], _trainer())
        with pytest.raises(InvalidArgument, match="do not form groups"):
            bridge(["a", "a"], _trainer())
        with pytest.raises(InvalidArgument, match="group of size 1"):
            bridge(["a"], _trainer(generations=1))
    finally:
        bridge.close()


def test_after_each_step_the_fleet_moves_to_a_saved_checkpoint(tmp_path: Path) -> None:
    client = _FakeClient(version=3)
    bridge = _bridge(tmp_path, client, keep_checkpoints=1)
    try:
        bridge(["a"] * 3, _trainer(0))  # the first call reads the fleet's version and samples under it
        assert client.updates == []
        bridge(["a"] * 3, _trainer(0))  # no step since: no update
        assert client.updates == []
        out = bridge(["a"] * 3, _trainer(1))
        first = tmp_path / "ckpt" / "v4"
        assert client.updates == [(4, str(first.resolve()))]
        assert (first / "config.json").is_file()
        assert out["polar_policy_version"] == 4
        bridge(["a"] * 3, _trainer(2))
        assert client.updates[-1][0] == 5
        assert not first.exists()  # keep_checkpoints=1: only v5 is left
        assert (tmp_path / "ckpt" / "v5" / "config.json").is_file()
        assert bridge.stats.policy_updates == 2
    finally:
        bridge.close()


def test_an_update_that_does_not_reach_every_proxy_stops_training(tmp_path: Path) -> None:
    client = _FakeClient(complete=False)
    bridge = _bridge(tmp_path, client)
    try:
        bridge(["a"] * 3, _trainer(0))
        with pytest.raises(FailedPrecondition, match="proxy:1: load failed"):
            bridge(["a"] * 3, _trainer(1))
    finally:
        bridge.close()


async def test_calling_the_bridge_on_its_own_event_loop_is_refused(tmp_path: Path) -> None:
    client = _FakeClient()
    bridge = polar_rollout_func(
        _settings(tmp_path),
        _Template(),
        args=_args(num_generations=3),
        loop=asyncio.get_running_loop(),
        client_factory=lambda: client,
    )
    with pytest.raises(FailedPrecondition, match="another thread"):
        bridge(["a"] * 3, _trainer())
    out = await asyncio.to_thread(bridge, ["a"] * 3, _trainer())
    assert len(out["prompt_ids"]) == 3
    await bridge.aclose()
    assert client.closed


def test_polar_reward_returns_the_rewards_and_logs_the_batch_counts() -> None:
    logged: dict[str, float] = {}
    rewards = polar_reward(
        ["x", "y"],
        polar_reward=[0.5, None],
        log_metric=logged.__setitem__,
        polar_failed_sessions=[1, 1],
        polar_refused_traces=[0, 0],
        polar_extra_traces=[2, 2],
        polar_policy_version=[4, 4],
        polar_status=["unresolved", "infra_error"],
    )
    assert rewards == [0.5, None]
    assert logged == {
        "polar/failed_sessions": 1.0,
        "polar/refused_traces": 0.0,
        "polar/extra_traces": 2.0,
        "polar/policy_version": 4.0,
    }
    with pytest.raises(InvalidArgument, match="rollout_func"):
        polar_reward(["x"])


def test_importing_the_bridge_loads_neither_trl_nor_torch() -> None:
    code = "import sys, polar_train.bridges.trl; print(sorted({'trl', 'torch'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
