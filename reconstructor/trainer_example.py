"""A minimal GRPO trainer over reconstructed traces: how a trainer should consume them.

What it shows, in order of importance:

The loss and the advantages are :mod:`polar_core.grpo` (one definition, which ``polar train`` uses too); this
module shows how to apply them.

* Advantages are group-relative over **sessions**, not traces: every session of a task counts once in the
  group's mean and standard deviation (review equation 11), however many traces reconstruction split it into.
* The loss is reduced per trace (token mean over mask-1 positions), then averaged with the trace weights, so
  with session weighting every session counts the same (review equation 12, ``g_session``).
* Truncated importance sampling: each mask-1 token is weighted by ``min(pi / pi_behaviour, C)`` (no
  gradient), using the behaviour logprob recorded at sampling time; the 0.0 placeholders of masked positions
  never enter the loss or its gradient.

Run ``python -m reconstructor.trainer_example`` for a demonstration on the tiny fixture model: it samples
multi-turn sessions through the real chat template, reconstructs them, checks that recomputed logprobs match
the behaviour logprobs on exact-context traces, and runs a few GRPO steps. Needs torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from polar_core.export import to_padded_tensors
from polar_core.grpo import group_advantages, grpo_loss, token_logprobs
from polar_core.records import CompletionRecord, ReconstructionStrategy, TerminalStatus, Trace
from reconstructor.core import ReconstructionOptions, SessionOutcome, reconstruct

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["GrpoConfig", "max_logprob_gap", "sample_sessions", "train_step"]


@dataclasses.dataclass(frozen=True, slots=True)
class GrpoConfig:
    """GRPO hyper-parameters of the example."""

    clip_eps: float = 0.2
    tis_cap: float = 2.0
    learning_rate: float = 1e-3
    pad_token_id: int = 0
    eps: float = 1e-6


def train_step(
    model: PreTrainedModel, optimizer: torch.optim.Optimizer, traces: Sequence[Trace], config: GrpoConfig
) -> dict[str, float]:
    """Run one GRPO update on ``traces`` and return its metrics."""
    import torch

    # Traces without a trainable token (infra_error and cancelled sessions) join no group and no average.
    trainable = [t for t in traces if any(t.loss_mask) and t.weight > 0]
    if not trainable:
        return {"loss": 0.0}
    batch = to_padded_tensors(trainable, pad_token_id=config.pad_token_id)
    advantages = torch.tensor(group_advantages(trainable, eps=config.eps), dtype=torch.float32)
    model.train(True)
    new = token_logprobs(model, batch["input_ids"], batch["attention_mask"])
    loss, metrics = grpo_loss(new, batch, advantages, clip_eps=config.clip_eps, tis_cap=config.tis_cap)
    optimizer.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    model.train(False)
    return metrics


def max_logprob_gap(model: PreTrainedModel, traces: Sequence[Trace], *, pad_token_id: int = 0) -> float:
    """Return the largest |recomputed - behaviour| logprob over the traces' mask-1 tokens (0.0 if none)."""
    import torch

    if not traces:
        return 0.0
    batch = to_padded_tensors(traces, pad_token_id=pad_token_id)
    with torch.no_grad():
        new = token_logprobs(model, batch["input_ids"], batch["attention_mask"])
    gap = ((new - batch["old_logprobs"]).abs() * batch["loss_mask"]).max()
    return float(gap)


def sample_sessions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    task_id: str,
    sessions: int,
    turns: int,
    max_new_tokens: int = 12,
    seed: int = 0,
) -> list[CompletionRecord]:
    """Sample multi-turn sessions the way the proxy records them: rendered prompts in, sampled IDs out.

    Each turn renders the whole conversation with the tokenizer's chat template, samples a reply with
    :func:`~polar_core.model_fixtures.generate_with_logprobs`, and appends the reply's decoded text (as a
    harness would see it) and a tool result; the next prompt is therefore the template's canonical rendering,
    which may tokenise the reply differently from how it was sampled.
    """
    from polar_core.model_fixtures import IM_END, generate_with_logprobs

    eot = tokenizer.convert_tokens_to_ids(IM_END)
    records: list[CompletionRecord] = []
    for s in range(sessions):
        session_id = f"{task_id}-s{s}"
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Task {task_id}: list the files."}]
        for turn in range(turns):
            prompt = list(
                tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            )
            ids, logprobs = generate_with_logprobs(
                model, prompt, max_new_tokens=max_new_tokens, seed=seed * 10_000 + s * 100 + turn, eos_token_id=eot
            )
            records.append(
                CompletionRecord(
                    session_id=session_id,
                    call_id=f"{session_id}-c{turn}",
                    seq=turn,
                    prompt_token_ids=prompt,
                    response_token_ids=ids,
                    response_logprobs=logprobs,
                    policy_version="0",
                    finish_reason="stop" if ids and ids[-1] == eot else "length",
                )
            )
            text = tokenizer.decode(ids, skip_special_tokens=True)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"Result {turn}: ok."}]
    return records


def _toy_reward(records: Sequence[CompletionRecord]) -> float:
    """Share of even token IDs in the final answer: a stand-in evaluator that gives the demo a signal."""
    final = records[-1].response_token_ids
    return sum(1 for t in final if t % 2 == 0) / max(len(final), 1)


def main(argv: Sequence[str] | None = None) -> None:
    """Demonstrate reconstruction and GRPO on the tiny fixture model (prints one line per step)."""
    import torch

    from polar_core.model_fixtures import IM_END, build_tiny_model, build_tiny_tokenizer

    parser = argparse.ArgumentParser(prog="python -m reconstructor.trainer_example")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--strategy", choices=[s.value for s in ReconstructionStrategy], default="prefix-merge")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    config = GrpoConfig(pad_token_id=int(tokenizer.pad_token_id))
    records: list[CompletionRecord] = []
    outcomes: dict[str, SessionOutcome] = {}
    for task in range(args.tasks):
        task_records = sample_sessions(
            model, tokenizer, task_id=f"t{task}", sessions=args.samples, turns=args.turns, seed=task
        )
        records += task_records
        by_session: dict[str, list[CompletionRecord]] = defaultdict(list)
        for r in task_records:
            by_session[r.session_id].append(r)
        for sid, recs in by_session.items():
            reward = _toy_reward(recs)
            status = TerminalStatus.RESOLVED if reward > 0.5 else TerminalStatus.UNRESOLVED
            outcomes[sid] = SessionOutcome(task_id=f"t{task}", reward=reward, status=status)

    eot = tokenizer.convert_tokens_to_ids(IM_END)
    assert isinstance(eot, int)
    options = ReconstructionOptions(strategy=ReconstructionStrategy(args.strategy), end_of_turn_ids=(eot,))
    result = reconstruct(records, options, outcomes)
    exact = [t for t in result.traces if t.exact_context]
    inexact = [t for t in result.traces if not t.exact_context]
    print(f"{len(records)} calls -> {len(result.traces)} traces ({len(exact)} exact-context)")
    per_request = reconstruct(records, dataclasses.replace(options, strategy=ReconstructionStrategy.PER_REQUEST))
    # Exact and per-request traces must match to float precision; inexact ones show what merging changed.
    for label, group in (("per-request", per_request.traces), ("exact-context", exact), ("inexact-context", inexact)):
        if group:
            print(f"max |recomputed - behaviour| logprob, {label} traces: {max_logprob_gap(model, group):.2e}")
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    for step in range(args.steps):
        metrics = train_step(model, optimizer, result.traces, config)
        print(f"step {step}: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        if not math.isfinite(metrics["loss"]):
            raise SystemExit("loss is not finite")


if __name__ == "__main__":
    main()
