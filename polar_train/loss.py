"""The GRPO step: group-relative advantages over sessions, truncated importance sampling, one AdamW step.

The loss itself is :func:`polar_core.grpo.grpo_loss` (one place defines it); this module
applies it to a :class:`~polar_train.batch.Batch`. Per mask-1 token with behaviour logprob ``b`` (recorded
by the proxy when the token was sampled, possibly by an older version) and current logprob ``n``::

    w    = min(exp(n - b), C)          detached: truncated importance sampling
    loss = -w * A * n                  A: the session's reward standardised within its group (task)

averaged over each trace's mask-1 tokens, then over traces with their session weights. Mask-0 positions
(prompt, tool results, padding) carry neither loss nor gradient.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING

from polar_core.export import to_padded_tensors
from polar_core.grpo import group_advantages, grpo_loss, token_logprobs
from polar_train.batch import Batch, check_lag_bound

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

__all__ = ["StepSettings", "advantages", "policy_loss", "row_logprobs", "train_on_batch"]


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


def row_logprobs(model: PreTrainedModel, input_ids: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """``[1, T]`` logprobs of one unpadded row's tokens after ``prompt_length`` (0.0 over the prompt).

    Only the response positions' logits are materialised (``logits_to_keep``), so a long prompt (a harness's
    system prompt and tools: thousands of tokens times the vocabulary) costs activations, not logits.
    """
    import torch

    length = int(input_ids.shape[1])
    keep = length - prompt_length + 1  # the position before the first response token predicts it
    forward_args = inspect.signature(model.forward).parameters
    if "logits_to_keep" not in forward_args or keep >= length:
        return token_logprobs(model, input_ids, torch.ones_like(input_ids))
    logits = model(input_ids=input_ids, logits_to_keep=keep).logits.float()[:, :-1]
    targets = input_ids[:, prompt_length:]
    picked = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(picked, (prompt_length, 0))


def train_on_batch(
    model: PreTrainedModel, optimizer: torch.optim.Optimizer, batch: Batch, settings: StepSettings
) -> dict[str, float]:
    """Run one optimiser step on ``batch``; return the loss metrics (``{"loss": 0.0}`` for an empty batch).

    The gradient is accumulated one trace at a time (each trace's loss scaled by its share of the batch's
    session weight), which gives the batch loss's gradient without padding and with one row's activations
    in memory at a time.

    Raises:
        LagBoundViolated: A trace beyond the batch's lag bound (never happens for a batch from
            :func:`~polar_train.batch.build_batch`; checked here because this is where tokens reach the loss).
    """
    check_lag_bound(batch.traces, current_version=batch.current_version, max_policy_lag=batch.max_policy_lag)
    if not batch.traces:
        return {"loss": 0.0}
    adv = advantages(batch)
    total_weight = sum(t.weight for t in batch.traces)
    sums = {"loss": 0.0, "mean_tis_weight": 0.0, "tis_truncated_fraction": 0.0}
    tokens = 0.0
    model.train(True)
    try:
        optimizer.zero_grad()
        for i, trace in enumerate(batch.traces):
            row = to_padded_tensors([trace], pad_token_id=settings.pad_token_id, max_length=settings.max_length or None)
            n = float(row["loss_mask"].sum())
            if n == 0:
                continue  # the trainable tokens were cut by max_length
            new = row_logprobs(model, row["input_ids"], int(row["prompt_lengths"][0]))
            loss, metrics = policy_loss(new, row, adv[i : i + 1], tis_cap=settings.tis_cap)
            (loss * (trace.weight / total_weight)).backward()  # type: ignore[no-untyped-call]
            sums["loss"] += metrics["loss"] * trace.weight / total_weight
            for key in ("mean_tis_weight", "tis_truncated_fraction"):
                sums[key] += metrics[key] * n
            tokens += n
        optimizer.step()
    finally:
        model.train(False)
    if tokens:
        for key in ("mean_tis_weight", "tis_truncated_fraction"):
            sums[key] /= tokens
    return sums
