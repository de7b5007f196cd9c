"""The GRPO loss Polar's trainers use, over reconstructed traces (one definition: ``polar train`` and the
reconstructor's example both import it).

* Advantages are group-relative over **sessions**, not traces: every session of a task counts once in the
  group's mean and standard deviation, however many traces reconstruction split it into.
* The loss is reduced per trace (token mean over mask-1 positions), then averaged with the trace weights.
* Truncated importance sampling: each mask-1 token is weighted by ``min(pi / pi_behaviour, C)`` (no gradient),
  using the behaviour logprob recorded at sampling time; masked positions never enter the loss or its gradient.

torch is imported only when a function needs it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from polar_core.records import Trace

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

__all__ = ["group_advantages", "grpo_loss", "token_logprobs"]


def group_advantages(traces: Sequence[Trace], *, eps: float = 1e-6) -> list[float]:
    """Return each trace's advantage, standardised within its task over sessions.

    A session's reward is the mean of its traces' rewards (they are equal unless a custom evaluator gave
    trace-level rewards); each trace's advantage is its own reward standardised with the mean and standard
    deviation of its task's session rewards.
    """
    session_rewards: dict[tuple[str, str], list[float]] = defaultdict(list)
    for t in traces:
        session_rewards[(t.task_id, t.session_id)].append(t.reward)
    per_task: dict[str, list[float]] = defaultdict(list)
    for (task, _), rewards in session_rewards.items():
        per_task[task].append(statistics.fmean(rewards))
    moments = {task: (statistics.fmean(r), statistics.pstdev(r)) for task, r in per_task.items()}
    return [(t.reward - moments[t.task_id][0]) / (moments[t.task_id][1] + eps) for t in traces]


def token_logprobs(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Return ``[batch, length]`` log-probabilities of each token given the tokens before it (0 at position 0)."""
    import torch

    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
    picked = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


def _masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Return ``values`` where ``mask`` is 1 and exactly 0.0 elsewhere.

    ``torch.where`` rather than a product: a placeholder that is ``inf`` or ``nan`` would survive ``x * 0``,
    and its gradient through the unselected branch is exactly zero.
    """
    import torch

    return torch.where(mask > 0, values, torch.zeros_like(values))


def grpo_loss(
    new_logprobs: torch.Tensor,
    batch: dict[str, torch.Tensor],
    advantages: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    tis_cap: float = 2.0,
    proximal_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return the GRPO policy loss with truncated importance sampling (TIS), and metrics.

    For each mask-1 token with behaviour logprob ``b`` (recorded when it was sampled), proximal logprob
    ``q`` (the current parameters before this update; by default ``new_logprobs`` detached) and new logprob
    ``n``::

        w     = min(exp(q - b), tis_cap)                      truncated importance weight, no gradient
        rho   = exp(n - q)                                    PPO ratio against the proximal policy
        loss  = -w * min(rho * A, clip(rho, 1 - eps, 1 + eps) * A)

    With the default proximal policy ``rho`` is 1 with gradient ``d n``, so the update is the truncated-IS
    policy gradient ``min(pi/pi_b, C) * A * grad log pi``: it corrects for the behaviour policy (another
    engine, older weights) without letting a rare token's ratio blow up. The per-token losses are averaged
    over each trace's mask-1 tokens, then over traces with their weights (session weights make every
    session count once). Mask-0 positions (prompt, interstitials, padding) enter nowhere: their logprobs
    are replaced by 0.0 before any exponential, so neither the loss nor its gradient depends on them.

    Args:
        new_logprobs: ``[batch, length]`` logprobs under the current parameters (see :func:`token_logprobs`).
        batch: A batch from :func:`~polar_core.export.to_padded_tensors`.
        advantages: ``[batch]`` advantages from :func:`group_advantages`.
        clip_eps: PPO clipping range.
        tis_cap: The truncation ``C`` of the importance weight.
        proximal_logprobs: Logprobs of the pre-update parameters, when several optimiser steps reuse a batch.
    """
    import torch

    mask = batch["loss_mask"]
    new = _masked(new_logprobs, mask)
    behaviour = _masked(batch["old_logprobs"], mask)
    proximal = new.detach() if proximal_logprobs is None else _masked(proximal_logprobs.detach(), mask)
    tis = torch.clamp(torch.exp(proximal - behaviour), max=tis_cap)  # 1.0 at masked positions, no gradient
    ratio = torch.exp(new - proximal)
    adv = advantages.unsqueeze(-1)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    tokens = mask.sum(-1).clamp(min=1.0)
    per_trace = -_masked(tis * surrogate, mask).sum(-1) / tokens
    weights = batch["weights"]
    loss = (per_trace * weights).sum() / weights.sum().clamp(min=1e-12)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        behaviour_ratio = torch.exp(proximal - behaviour)
        metrics = {
            "loss": float(loss.detach()),
            "mean_ratio": float(_masked(ratio, mask).sum() / n),
            "clip_fraction": float(_masked(((ratio - 1).abs() > clip_eps).float(), mask).sum() / n),
            "mean_tis_weight": float(_masked(tis, mask).sum() / n),
            "tis_truncated_fraction": float(_masked((behaviour_ratio > tis_cap).float(), mask).sum() / n),
        }
    return loss, metrics
