from __future__ import annotations

import pytest
import torch

from polar_core.records import Trace
from reconstructor.export import to_padded_tensors
from reconstructor.trainer_example import group_advantages, grpo_loss


def trace(session: str, task: str, reward: float, weight: float = 1.0) -> Trace:
    return Trace(
        session_id=session,
        task_id=task,
        trace_index=0,
        call_ids=["c"],
        prompt_token_ids=[1],
        response_token_ids=[2, 3],
        loss_mask=[1, 1],
        response_logprobs=[-1.0, -2.0],
        reward=reward,
        weight=weight,
    )


def test_advantages_count_each_session_once():
    # Session a was split into three traces; it must not outweigh session b in the group statistics.
    traces = [trace("a", "t", 1.0), trace("a", "t", 1.0), trace("a", "t", 1.0), trace("b", "t", 0.0)]
    adv = group_advantages(traces, eps=0.0)
    assert adv == pytest.approx([1.0, 1.0, 1.0, -1.0])
    other = group_advantages([trace("c", "u", 5.0)], eps=1e-6)
    assert other == [0.0]


def test_loss_is_zero_ratio_one_at_behaviour_logprobs_and_ignores_masked_positions():
    t = trace("a", "t", 1.0)
    t.loss_mask[1] = 0
    t.response_logprobs[1] = 0.0
    batch = to_padded_tensors([t])
    new = batch["old_logprobs"].clone()
    new[0, 2] = 123.0  # a masked position: whatever the model says there must not matter
    loss, metrics = grpo_loss(new, batch, torch.tensor([2.0]))
    assert metrics["mean_ratio"] == pytest.approx(1.0)
    assert float(loss) == pytest.approx(-2.0)  # -(ratio 1 * advantage 2) averaged over one token


def test_weights_decide_how_much_each_trace_counts():
    a, b = trace("a", "t", 1.0, weight=1.0), trace("b", "t", 0.0, weight=3.0)
    batch = to_padded_tensors([a, b])
    loss, _ = grpo_loss(batch["old_logprobs"], batch, torch.tensor([1.0, -1.0]))
    assert float(loss) == pytest.approx((1.0 * -1.0 + 3.0 * 1.0) / 4.0)
