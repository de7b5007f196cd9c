"""The GRPO step: group-relative advantages over sessions, truncated importance sampling, one AdamW step.

The loss itself is :func:`reconstructor.trainer_example.grpo_loss` (one place defines it); this module
applies it to a :class:`~polar_train.batch.Batch`. Per mask-1 token with behaviour logprob ``b`` (recorded
by the proxy when the token was sampled, possibly by an older version) and current logprob ``n``::

    w    = min(exp(n - b), C)          detached: truncated importance sampling
    loss = -w * A * n                  A: the session's reward standardised within its group (task)

averaged over each trace's mask-1 tokens, then over traces with their session weights. Mask-0 positions
(prompt, tool results, padding) carry neither loss nor gradient.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from polar_train.batch import Batch, check_lag_bound
from reconstructor.export import to_padded_tensors
from reconstructor.trainer_example import group_advantages, grpo_loss, token_logprobs

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

__all__ = ["StepSettings", "advantages", "policy_loss", "train_on_batch"]


@dataclasses.dataclass(frozen=True, slots=True)
class StepSettings:
    """What one optimiser step needs besides the batch.

    Attributes:
        tis_cap: The truncation ``C`` of the importance weight.
        pad_token_id: Padding token of the rows.
        max_length: Cut rows to this many tokens (0: no limit).
    """

    tis_cap: float = 2.0
    pad_token_id: int = 0
    max_length: int = 0


def advantages(batch: Batch) -> torch.Tensor:
    """``[len(batch.traces)]`` advantages: each session's reward standardised over its group's sessions."""
    import torch

    return torch.tensor(group_advantages(list(batch.traces)), dtype=torch.float32)


def policy_loss(
    new_logprobs: torch.Tensor, tensors: dict[str, torch.Tensor], adv: torch.Tensor, *, tis_cap: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """The truncated-IS policy-gradient loss of padded ``tensors`` (see the module docstring)."""
    # One optimiser step per batch: the proximal policy is the current one, so the PPO ratio is 1 and the
    # clip never binds; what remains is min(pi/pi_b, C) * A * grad log pi.
    return grpo_loss(new_logprobs, tensors, adv, tis_cap=tis_cap)


def train_on_batch(
    model: PreTrainedModel, optimizer: torch.optim.Optimizer, batch: Batch, settings: StepSettings
) -> dict[str, float]:
    """Run one optimiser step on ``batch``; return the loss metrics (``{"loss": 0.0}`` for an empty batch).

    Raises:
        LagBoundViolated: A trace beyond the batch's lag bound (never happens for a batch from
            :func:`~polar_train.batch.build_batch`; checked here because this is where tokens reach the loss).
    """
    check_lag_bound(batch.traces, current_version=batch.current_version, max_policy_lag=batch.max_policy_lag)
    if not batch.traces:
        return {"loss": 0.0}
    tensors = to_padded_tensors(
        list(batch.traces), pad_token_id=settings.pad_token_id, max_length=settings.max_length or None
    )
    model.train(True)
    try:
        new = token_logprobs(model, tensors["input_ids"], tensors["attention_mask"])
        loss, metrics = policy_loss(new, tensors, advantages(batch), tis_cap=settings.tis_cap)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    finally:
        model.train(False)
    return metrics
