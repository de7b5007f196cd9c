from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from polar_core.export import to_padded_tensors
from polar_core.grpo import group_advantages, grpo_loss, token_logprobs
from polar_core.model_fixtures import IM_END, build_tiny_model, build_tiny_tokenizer
from polar_core.records import CompletionRecord, ReconstructionStrategy, TerminalStatus, Trace
from reconstructor import ReconstructionOptions, SessionOutcome, reconstruct
from reconstructor.trainer_example import GrpoConfig, train_step


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


def test_loss_is_minus_advantage_at_behaviour_logprobs_and_ignores_masked_positions():
    t = trace("a", "t", 1.0)
    t.loss_mask[1] = 0
    t.response_logprobs[1] = 0.0
    batch = to_padded_tensors([t])
    new = batch["old_logprobs"].clone()
    new[0, 2] = 123.0  # a masked position: whatever the model says there must not matter
    loss, metrics = grpo_loss(new, batch, torch.tensor([2.0]))
    assert metrics["mean_ratio"] == pytest.approx(1.0)
    assert metrics["mean_tis_weight"] == pytest.approx(1.0)
    assert float(loss.detach()) == pytest.approx(-2.0)  # -(weight 1 * ratio 1 * advantage 2) over one token


def test_weights_decide_how_much_each_trace_counts():
    a, b = trace("a", "t", 1.0, weight=1.0), trace("b", "t", 0.0, weight=3.0)
    batch = to_padded_tensors([a, b])
    loss, _ = grpo_loss(batch["old_logprobs"], batch, torch.tensor([1.0, -1.0]))
    assert float(loss.detach()) == pytest.approx((1.0 * -1.0 + 3.0 * 1.0) / 4.0)


def test_truncated_importance_weights_are_capped_and_carry_no_gradient():
    batch = to_padded_tensors([trace("a", "t", 1.0)])
    # Token 1 is 5x likelier now than when sampled (capped at 2); token 2 half as likely (weight 0.5).
    new = (batch["old_logprobs"] + torch.tensor([[0.0, math.log(5.0), math.log(0.5)]])).requires_grad_(True)
    loss, metrics = grpo_loss(new, batch, torch.tensor([1.0]), tis_cap=2.0)
    loss.backward()  # type: ignore[no-untyped-call]
    assert float(loss.detach()) == pytest.approx(-(2.0 + 0.5) / 2)
    assert metrics["tis_truncated_fraction"] == pytest.approx(0.5)
    assert metrics["mean_tis_weight"] == pytest.approx(1.25)
    # d loss / d logprob = -w * A / tokens: the weight scales the gradient but is not differentiated.
    assert new.grad is not None
    assert new.grad[0].tolist() == pytest.approx([0.0, -1.0, -0.25])


def test_proximal_logprobs_give_the_clipped_ppo_ratio():
    batch = to_padded_tensors([trace("a", "t", 1.0)])
    proximal = batch["old_logprobs"].clone()
    new = proximal + torch.tensor([[0.0, math.log(1.5), math.log(1.1)]])
    loss, metrics = grpo_loss(new, batch, torch.tensor([1.0]), clip_eps=0.2, proximal_logprobs=proximal)
    assert float(loss.detach()) == pytest.approx(-(1.2 + 1.1) / 2)  # the first ratio is clipped at 1 + eps
    assert metrics["clip_fraction"] == pytest.approx(0.5)


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    tokenizer = build_tiny_tokenizer()
    return build_tiny_model(tokenizer, seed=0), tokenizer


def _records(tokenizer: Any) -> tuple[list[CompletionRecord], int]:
    """Two sessions of one task, each two calls merged with an interstitial, sampled IDs chosen by hand."""
    eot = int(tokenizer.convert_tokens_to_ids(IM_END))
    records = []
    for s, (a1, a2) in enumerate([([40, 41, eot], [42, eot]), ([50, eot], [51, 52, 53, eot])]):
        p1 = [10, 11, 12]
        p2 = [*p1, *a1, 60, 61, 62]  # the sampled turn rendered as sampled, then a tool result (masked)
        for seq, (prompt, response) in enumerate([(p1, a1), (p2, a2)]):
            logprobs = [-0.5 - 0.1 * i - s for i in range(len(response))]
            records.append(
                CompletionRecord(f"s{s}", f"s{s}-c{seq}", seq, prompt, response, logprobs, policy_version="0")
            )
    return records, eot


def _loss_and_grads(model: Any, batch: dict[str, torch.Tensor], new_override: Any = None) -> tuple[float, list[Any]]:
    model.zero_grad()
    new = token_logprobs(model, batch["input_ids"], batch["attention_mask"])
    if new_override is not None:
        new = new_override(new)
    advantages = torch.tensor([1.0, -1.0])
    loss, _ = grpo_loss(new, batch, advantages, tis_cap=2.0)
    loss.backward()  # type: ignore[no-untyped-call]
    return float(loss.detach()), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_masked_positions_contribute_nothing_to_the_loss_or_its_gradient_on_the_tiny_model(tiny):
    model, tokenizer = tiny
    records, eot = _records(tokenizer)
    outcomes = {
        "s0": SessionOutcome(task_id="t", reward=1.0, status=TerminalStatus.RESOLVED),
        "s1": SessionOutcome(task_id="t", reward=0.0, status=TerminalStatus.UNRESOLVED),
    }
    options = ReconstructionOptions(strategy=ReconstructionStrategy.PREFIX_MERGE, end_of_turn_ids=(eot,))
    traces = reconstruct(records, options, outcomes).traces
    assert [t.loss_mask for t in traces] == [[1, 1, 1, 0, 0, 0, 1, 1], [1, 1, 0, 0, 0, 1, 1, 1, 1]]
    batch = to_padded_tensors(traces, pad_token_id=int(tokenizer.pad_token_id))
    masked = batch["loss_mask"] == 0
    assert bool(masked[0, -1])  # the shorter trace is padded

    base_loss, base_grads = _loss_and_grads(model, batch)
    assert base_grads
    assert any(bool(g.abs().sum() > 0) for g in base_grads)

    # 1. Placeholder logprobs at mask-0 positions (prompt, interstitial, padding) set to garbage.
    garbage = dict(batch)
    garbage["old_logprobs"] = torch.where(masked, torch.full_like(batch["old_logprobs"], 1e4), batch["old_logprobs"])
    garbage["old_logprobs"][0, 0] = float("nan")
    # 2. Padding tokens replaced (attention_mask keeps them out of every real position's context).
    garbage["input_ids"] = torch.where(
        batch["attention_mask"] == 0, torch.full_like(batch["input_ids"], 7), batch["input_ids"]
    )
    # 3. The model's own logprobs at mask-0 positions replaced by arbitrary values with a gradient path.
    noise = torch.randn_like(batch["old_logprobs"]) * 100

    def scramble(new: torch.Tensor) -> torch.Tensor:
        return torch.where(masked, new * 3 + noise, new)

    loss, grads = _loss_and_grads(model, garbage, scramble)
    assert loss == base_loss
    assert all(torch.equal(a, b) for a, b in zip(base_grads, grads, strict=True))

    # The gradient reaching the per-position logprobs is exactly zero wherever the mask is 0.
    new = token_logprobs(model, batch["input_ids"], batch["attention_mask"]).detach().requires_grad_(True)
    loss_t, _ = grpo_loss(new, batch, torch.tensor([1.0, -1.0]))
    loss_t.backward()  # type: ignore[no-untyped-call]
    assert new.grad is not None
    assert bool((new.grad[masked] == 0).all())
    assert bool((new.grad[~masked] != 0).any())


def test_train_step_on_the_tiny_model_skips_untrainable_sessions(tiny):
    model, tokenizer = tiny
    records, eot = _records(tokenizer)
    outcomes = {
        "s0": SessionOutcome(task_id="t", reward=1.0, status=TerminalStatus.RESOLVED),
        "s1": SessionOutcome(task_id="t", reward=0.0, status=TerminalStatus.INFRA_ERROR),
    }
    traces = reconstruct(records, ReconstructionOptions(end_of_turn_ids=(eot,)), outcomes).traces
    assert sum(t.weight for t in traces if t.session_id == "s1") == 1.0
    assert not any(traces[1].loss_mask)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        metrics = train_step(model, optimizer, traces, GrpoConfig(pad_token_id=int(tokenizer.pad_token_id)))
    finally:
        model.load_state_dict(state)
    # Only session s0 is left: a group of one has advantage 0, so the loss is exactly zero.
    assert metrics["loss"] == 0.0
    assert metrics["mean_ratio"] == pytest.approx(1.0)
