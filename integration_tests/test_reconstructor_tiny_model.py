"""Reconstruction against a real model: recomputed logprobs must equal the behaviour logprobs wherever a trace
claims exact context, and merged traces must flag every context the template re-tokenised."""

from __future__ import annotations

from typing import Any

import pytest

from polar_core.model_fixtures import IM_END, build_tiny_model, build_tiny_tokenizer, generate_with_logprobs
from polar_core.records import CompletionRecord, ReconstructionStrategy
from reconstructor import ReconstructionOptions, ReconstructionResult, reconstruct
from reconstructor.trainer_example import max_logprob_gap, sample_sessions
from reconstructor.verify import check_trace

TOLERANCE = 1e-4  # KV-cache decoding versus one full forward pass differ by float rounding only


@pytest.fixture(scope="module")
def model_and_tokenizer() -> tuple[Any, Any]:
    tokenizer = build_tiny_tokenizer()
    return build_tiny_model(tokenizer, seed=0), tokenizer


def _options(strategy: ReconstructionStrategy, eot: int) -> ReconstructionOptions:
    return ReconstructionOptions(strategy=strategy, end_of_turn_ids=(eot,))


def _token_native_sessions(model, tokenizer, sessions: int, turns: int) -> list[CompletionRecord]:
    """A harness that appends sampled IDs verbatim (as a token-in/token-out proxy with a prefix cache would)."""
    eot = tokenizer.convert_tokens_to_ids(IM_END)
    records = []
    for s in range(sessions):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Fix the failing test."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for turn in range(turns):
            ids, logprobs = generate_with_logprobs(
                model, prompt, max_new_tokens=10, seed=s * 100 + turn, eos_token_id=eot
            )
            records.append(
                CompletionRecord(
                    session_id=f"native-{s}",
                    call_id=f"native-{s}-{turn}",
                    seq=turn,
                    prompt_token_ids=list(prompt),
                    response_token_ids=ids,
                    response_logprobs=logprobs,
                    finish_reason="stop" if ids[-1] == eot else "length",
                )
            )
            closing = [] if ids[-1] == eot else [eot]
            tool = tokenizer.encode(f"\n<|im_start|>user\nResult {turn}<|im_end|>\n<|im_start|>assistant\n")
            prompt = [*prompt, *ids, *closing, *tool]
    return records


def _check(result: ReconstructionResult, records: list[CompletionRecord]) -> None:
    by_id = {r.call_id: r for r in records}
    for trace in result.traces:
        check_trace(trace, by_id)


def test_exact_traces_reproduce_behaviour_logprobs(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    eot = tokenizer.convert_tokens_to_ids(IM_END)
    records = _token_native_sessions(model, tokenizer, sessions=2, turns=3)
    merged = reconstruct(records, _options(ReconstructionStrategy.PREFIX_MERGE, eot))
    _check(merged, records)
    assert len(merged.traces) == 2, "an append-only token harness merges each session into one trace"
    assert all(t.exact_context for t in merged.traces)
    assert max_logprob_gap(model, merged.traces) < TOLERANCE


def test_text_harness_merges_are_flagged_and_exact_strategy_stays_faithful(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    eot = tokenizer.convert_tokens_to_ids(IM_END)
    records = sample_sessions(model, tokenizer, task_id="t", sessions=3, turns=3, max_new_tokens=10)
    for strategy in ReconstructionStrategy:
        result = reconstruct(records, _options(strategy, eot))
        _check(result, records)
        exact = [t for t in result.traces if t.exact_context]
        assert max_logprob_gap(model, exact) < TOLERANCE, strategy
        if strategy is ReconstructionStrategy.PREFIX_MERGE:
            inexact = [t for t in result.traces if not t.exact_context]
            # A random model samples non-canonical tokenisations, so the re-rendered history differs; the
            # flag must say so, and the merged context really does change the logprobs.
            assert result.stats.mismatched_context_calls > 0
            assert max_logprob_gap(model, inexact) > TOLERANCE
        else:
            assert len(exact) == len(result.traces)
