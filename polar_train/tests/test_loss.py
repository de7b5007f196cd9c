"""The GRPO loss: advantages over sessions, truncated IS, no gradient through mask-0 positions."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

import torch

from polar_core.model_fixtures import build_tiny_model, build_tiny_tokenizer
from polar_core.records import Trace
from polar_train.batch import Batch, LagBoundViolated, SessionSample, build_batch
from polar_train.loss import StepSettings, advantages, policy_loss, train_on_batch


def _tensors(old: list[list[float]], mask: list[list[float]]) -> dict[str, torch.Tensor]:
    m = torch.tensor(mask)
    return {"loss_mask": m, "old_logprobs": torch.tensor(old), "weights": torch.ones(m.shape[0])}


def test_mask_zero_positions_carry_no_gradient_even_with_non_finite_placeholders() -> None:
    new = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.7, -0.2, -1.5, -9.0]], requires_grad=True)
    mask = [[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0]]
    old = [[math.inf, -2.1, -0.4, math.nan], [-0.8, -math.inf, -1.4, 0.0]]
    loss, metrics = policy_loss(new, _tensors(old, mask), torch.tensor([1.0, -1.0]), tis_cap=2.0)
    loss.backward()  # type: ignore[no-untyped-call]
    assert math.isfinite(float(loss.detach()))
    assert new.grad is not None
    grad = new.grad
    assert grad[torch.tensor(mask) == 0].abs().max() == 0.0
    assert (grad[torch.tensor(mask) == 1] != 0).all()
    assert metrics["mean_tis_weight"] > 0


def test_the_importance_weight_is_truncated_at_c_and_detached() -> None:
    # Behaviour logprob far below the current one: ratio e^5, truncated at C = 2.
    new = torch.tensor([[-1.0]], requires_grad=True)
    loss, metrics = policy_loss(new, _tensors([[-6.0]], [[1.0]]), torch.tensor([1.0]), tis_cap=2.0)
    loss.backward()  # type: ignore[no-untyped-call]
    assert new.grad is not None
    assert float(new.grad[0, 0]) == pytest.approx(-2.0)  # -min(ratio, C) * A, no gradient through the ratio
    assert metrics["tis_truncated_fraction"] == 1.0
    # Below the cap the weight is the ratio itself.
    new2 = torch.tensor([[-1.0]], requires_grad=True)
    loss2, _ = policy_loss(new2, _tensors([[-1.5]], [[1.0]]), torch.tensor([1.0]), tis_cap=2.0)
    loss2.backward()  # type: ignore[no-untyped-call]
    assert new2.grad is not None
    assert float(new2.grad[0, 0]) == pytest.approx(-math.exp(0.5))


def _trace(
    session: str, task: str, reward: float, *, index: int = 0, version: str = "0", response: tuple[int, int] = (8, 9)
) -> Trace:
    return Trace(
        session_id=session,
        task_id=task,
        trace_index=index,
        call_ids=[f"{session}-{index}"],
        prompt_token_ids=[5, 6, 7],
        response_token_ids=list(response),
        loss_mask=[1, 1],
        response_logprobs=[-3.0, -3.0],
        reward=reward,
        policy_versions=[version],
    )


def test_advantages_are_relative_within_a_group_and_count_each_session_once() -> None:
    sessions = [
        SessionSample("g1", "a", "resolved", 1.0, (_trace("a", "g1", 1.0), _trace("a", "g1", 1.0, index=1)), (0, 0)),
        SessionSample("g1", "b", "unresolved", 0.0, (_trace("b", "g1", 0.0),), (0,)),
        SessionSample("g2", "c", "unresolved", 0.2, (_trace("c", "g2", 0.2),), (0,)),
        SessionSample("g2", "d", "unresolved", 0.2, (_trace("d", "g2", 0.2),), (0,)),
    ]
    adv = advantages(build_batch(sessions, current_version=0, max_policy_lag=0))
    # g1: sessions 1.0 and 0.0 (mean 0.5, std 0.5) whatever a's two traces; g2: no spread, no signal.
    assert adv.tolist() == pytest.approx([1.0, 1.0, -1.0, 0.0, 0.0], abs=1e-5)


def test_one_step_on_the_tiny_model_moves_the_weights_and_rejects_stale_batches() -> None:
    torch.manual_seed(0)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    sessions = [
        SessionSample("g", "a", "resolved", 1.0, (_trace("a", "g", 1.0, version="1"),), (0,)),
        SessionSample("g", "b", "unresolved", 0.0, (_trace("b", "g", 0.0, version="2", response=(10, 11)),), (0,)),
    ]
    batch = build_batch(sessions, current_version=2, max_policy_lag=1)
    before = [p.detach().clone() for p in model.parameters()]
    metrics = train_on_batch(model, optimizer, batch, StepSettings(pad_token_id=int(tokenizer.pad_token_id)))
    assert math.isfinite(metrics["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not model.training
    stale = Batch(
        batch.traces,
        batch.lags,
        current_version=3,
        max_policy_lag=1,
        sessions=(),
        stale_traces=0,
        stale_tokens=0,
        untrainable_traces=0,
    )
    with pytest.raises(LagBoundViolated):
        train_on_batch(model, optimizer, stale, StepSettings())
    empty = build_batch([], current_version=0, max_policy_lag=0)
    assert train_on_batch(model, optimizer, empty, StepSettings()) == {"loss": 0.0}


def test_accumulating_one_trace_at_a_time_gives_the_batch_gradient() -> None:
    """train_on_batch's per-row accumulation (response logits only) equals the padded batch loss's gradient."""
    from polar_core.export import to_padded_tensors
    from polar_core.grpo import token_logprobs

    tokenizer = build_tiny_tokenizer()
    pad = int(tokenizer.pad_token_id)
    traces = [
        Trace(
            "a",
            "g",
            0,
            ["a"],
            [5, 6, 7, 8],
            [9, 10, 11],
            [1, 0, 1],
            [-3.0, 0.0, -2.5],
            reward=1.0,
            policy_versions=["0"],
        ),
        Trace(
            "b", "g", 0, ["b"], [5, 6], [12, 13], [1, 1], [-4.0, -3.5], reward=0.0, weight=0.5, policy_versions=["0"]
        ),
    ]
    sessions = [SessionSample("g", t.session_id, "unresolved", t.reward, (t,), (0,)) for t in traces]
    batch = build_batch(sessions, current_version=0, max_policy_lag=0)
    grads = []
    for mode in ("batch", "rows"):
        model = build_tiny_model(tokenizer, seed=0)
        model.train(False)  # no dropout either way
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        if mode == "batch":
            tensors = to_padded_tensors(traces, pad_token_id=pad)
            new = token_logprobs(model, tensors["input_ids"], tensors["attention_mask"])
            loss, _ = policy_loss(new, tensors, advantages(batch), tis_cap=2.0)
            loss.backward()  # type: ignore[no-untyped-call]
        else:
            train_on_batch(model, optimizer, batch, StepSettings(pad_token_id=pad))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
