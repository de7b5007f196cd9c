"""Polar session results → slime samples: fields, statuses, zeroing, refusal, multi-trace choice, staleness."""

from __future__ import annotations

from typing import Any

import pytest
from polar.common.v1 import session_pb2, task_pb2

from polar_train.bridges.slime_convert import BridgeCounters, fill_group, trace_problem
from polar_train.bridges.tests.slime_fakes import result, trace
from polar_train.bridges.tests.slime_sample_standin import Sample, StandInDataSource, check_train_contract

TASK = task_pb2.Task(task_id="run-g00000007", num_samples=4)


def _group(n: int = 4) -> list[Sample]:
    return StandInDataSource(["Reply in lowercase."], n).get_samples(1)[0]


def _fill(results: dict[int, session_pb2.SessionResult], **kw: Any) -> tuple[list[Sample], BridgeCounters, bool]:
    samples, counters = _group(), BridgeCounters()
    options: dict[str, Any] = {"current_version": 0, "max_policy_lag": 1, "multi_trace": "longest", **kw}
    ok = fill_group(samples, results, group_id=7, task_id=TASK.task_id, counters=counters, **options)
    return samples, counters, ok


def test_a_resolved_session_fills_every_training_field() -> None:
    results = {i: result(TASK, i, traces=[trace(versions=("3", "4"))]) for i in range(4)}
    samples, counters, ok = _fill(results, current_version=4)
    assert ok
    check_train_contract([samples], rollout_batch_size=1, n_samples_per_prompt=4)
    s = samples[2]
    assert s.tokens == [1, 2, 3, 11, 12, 13, 14]
    assert s.response_length == 4
    assert s.loss_mask == [1, 0, 1, 1]
    assert s.rollout_log_probs == [-0.5, 0.0, -0.25, -0.125]
    assert s.reward == pytest.approx(0.2)
    assert s.status is Sample.Status.COMPLETED
    assert s.weight_versions == ["3", "4"]
    assert s.metadata["policy_version"] == 3  # the oldest call's: the one the lag is measured from
    assert s.metadata["policy_lag"] == 1
    assert s.metadata["group_id"] == 7
    assert s.metadata["polar_task_id"] == TASK.task_id
    assert s.metadata["polar_session_id"] == f"{TASK.task_id}-s2"
    assert s.prompt == "Reply in lowercase."
    assert s.label == "label-0"
    assert not s.remove_sample
    assert counters.zeroed_samples == counters.refused_traces == counters.stale_samples == 0


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("resolved", Sample.Status.COMPLETED),
        ("unresolved", Sample.Status.COMPLETED),
        ("invalid_patch", Sample.Status.COMPLETED),
        ("eval_timeout", Sample.Status.COMPLETED),
        ("agent_timeout", Sample.Status.TRUNCATED),
        ("infra_error", Sample.Status.FAILED),
        ("cancelled", Sample.Status.ABORTED),
    ],
)
def test_statuses_map_to_slimes_enum(status: str, expected: Sample.Status) -> None:
    results = {i: result(TASK, i) for i in range(4)}
    results[1] = result(TASK, 1, status=status, reward=0.9)
    samples, counters, _ = _fill(results)
    assert samples[1].status is expected
    zeroed = expected in (Sample.Status.FAILED, Sample.Status.ABORTED)
    assert counters.zeroed_samples == int(zeroed)
    if zeroed:  # failed and aborted trajectories never carry loss or credit
        assert samples[1].reward == 0.0
        assert samples[1].loss_mask == [0, 0, 0, 0]
        assert samples[1].remove_sample
        assert samples[1].response_length == 4  # the trace's tokens stay, masked
    else:
        assert samples[1].reward == pytest.approx(0.9)
        assert samples[1].loss_mask == [1, 0, 1, 1]


def test_a_session_without_a_trace_or_result_is_a_masked_one_token_sample() -> None:
    results = {i: result(TASK, i) for i in (0, 2)}
    results[2] = result(TASK, 2, status="infra_error", traces=[])
    samples, counters, ok = _fill(results)
    assert ok
    check_train_contract([samples], rollout_batch_size=1, n_samples_per_prompt=4)
    for index in (1, 2, 3):  # 1 and 3 never reported, 2 has no trace
        s = samples[index]
        assert s.status is Sample.Status.FAILED
        assert s.tokens == [1, 2, 3]
        assert s.response_length == 1
        assert s.loss_mask == [0]
        assert s.rollout_log_probs == [0.0]
        assert s.reward == 0.0
    assert samples[1].metadata["polar_status"] == "missing"
    assert counters.zeroed_samples == 3


def test_a_group_without_any_usable_trace_is_left_for_the_caller_to_discard() -> None:
    results = {i: result(TASK, i, status="infra_error", traces=[]) for i in range(4)}
    samples, _, ok = _fill(results)
    assert not ok
    assert all(s.status is Sample.Status.PENDING and not s.tokens for s in samples)


@pytest.mark.parametrize(
    "bad",
    [
        trace(mask=[1, 1, 1]),  # mask shorter than the response
        trace(logprobs=[-0.1, -0.2]),  # log-probs shorter than the response
        trace(mask=[1, 2, 1, 1]),  # not a mask
    ],
)
def test_traces_whose_mask_and_logprobs_disagree_never_reach_the_trainer(bad: Any) -> None:
    assert trace_problem(bad) is not None
    results = {i: result(TASK, i) for i in range(4)}
    results[3] = result(TASK, 3, traces=[trace(), bad])
    samples, counters, _ = _fill(results)
    assert counters.refused_traces == 1
    s = samples[3]
    assert s.status is Sample.Status.FAILED
    assert s.reward == 0.0
    assert s.loss_mask is not None
    assert s.rollout_log_probs is not None
    assert not any(s.loss_mask)
    assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
    check_train_contract([samples], rollout_batch_size=1, n_samples_per_prompt=4)


def test_a_split_session_gives_one_sample_longest_or_last() -> None:
    short_late = trace(response=[21, 22], mask=[1, 1], logprobs=[-1.0, -1.0], index=1)
    long_early = trace(index=0, mask=[1, 1, 1, 1], logprobs=[-0.1] * 4)
    results = {i: result(TASK, i, traces=[long_early, short_late]) for i in range(4)}
    longest, counters, _ = _fill(results)
    assert longest[0].response_length == 4
    assert longest[0].metadata["polar_trace_index"] == 0
    assert longest[0].metadata["polar_traces"] == 2
    assert counters.multi_trace_sessions == 4
    last, _, _ = _fill(results, multi_trace="last")
    assert last[0].tokens == [1, 2, 3, 21, 22]
    assert last[0].metadata["polar_trace_index"] == 1


def test_a_sample_beyond_the_lag_bound_keeps_its_reward_but_not_its_loss() -> None:
    results = {i: result(TASK, i) for i in range(4)}
    results[0] = result(TASK, 0, reward=0.7, traces=[trace(versions=("1",))])
    samples, counters, _ = _fill(results, current_version=3, max_policy_lag=1)
    assert counters.stale_samples == 4  # version "0" is 3 behind as well
    assert samples[0].metadata["policy_lag"] == 2
    assert samples[0].reward == pytest.approx(0.7)
    assert samples[0].loss_mask == [0, 0, 0, 0]
    assert samples[0].metadata["polar_stale"]
    fresh, counters, _ = _fill(results, current_version=1, max_policy_lag=1)
    assert counters.stale_samples == 0
    assert fresh[0].loss_mask == [1, 0, 1, 1]
