"""Property tests over randomly generated sessions with known structure (see ``reconstructor.synthetic``).

Five generators, each isolating one shape real harnesses produce (and one mixing them all), are checked for:
the mask-1 invariant, aligned lengths, truthful ``exact_context`` in every strategy, and that per-request,
prefix-merge and exact traces hold the same multiset of sampled tokens at their trainable positions.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from polar_core.records import CompletionRecord, ReconstructionStrategy, TerminalStatus, Trace
from reconstructor import ReconstructionOptions, SessionOutcome, SplitReason, reconstruct_session
from reconstructor.synthetic import IM_END, SyntheticSpec, synthetic_session
from reconstructor.verify import check_trace, trace_is_exact

_base = {
    "turns": st.integers(1, 10),
    "system_tokens": st.integers(4, 30),
    "response_tokens": st.integers(1, 10),
    "tool_tokens": st.integers(1, 10),
    "truncate_prob": st.sampled_from([0.0, 0.3]),
    "parent_ids": st.booleans(),
}

GENERATORS: dict[str, st.SearchStrategy[SyntheticSpec]] = {
    "append_only": st.builds(SyntheticSpec, **_base),
    "compaction": st.builds(SyntheticSpec, compaction_every=st.integers(1, 4), **_base),
    "subagent_branches": st.builds(
        SyntheticSpec, subagents=st.integers(0, 3), forks=st.integers(1, 2), subagent_turns=st.integers(1, 4), **_base
    ),
    "parallel_identical_prompts": st.builds(SyntheticSpec, parallel_prob=st.sampled_from([0.3, 1.0]), **_base),
    "non_canonical_tokenisation": st.builds(SyntheticSpec, retokenize_prob=st.sampled_from([0.3, 1.0]), **_base),
    "mixed": st.builds(
        SyntheticSpec,
        retokenize_prob=st.sampled_from([0.0, 0.3]),
        compaction_every=st.integers(0, 4),
        subagents=st.integers(0, 2),
        forks=st.integers(0, 2),
        parallel_prob=st.sampled_from([0.0, 0.3]),
        **_base,
    ),
}

sessions = st.sampled_from(sorted(GENERATORS)).flatmap(lambda name: GENERATORS[name])
seeds = st.integers(0, 2**32 - 1)


def _reconstruct(records: list[CompletionRecord], strategy: ReconstructionStrategy) -> list[Trace]:
    options = ReconstructionOptions(strategy=strategy, end_of_turn_ids=(IM_END,))
    outcome = SessionOutcome(task_id="t", reward=1.0, status=TerminalStatus.RESOLVED)
    return reconstruct_session(records, options, outcome).traces


def _sampled(traces: list[Trace]) -> Counter[tuple[int, float]]:
    return Counter(
        (tok, lp)
        for t in traces
        for tok, lp, m in zip(t.response_token_ids, t.response_logprobs, t.loss_mask, strict=True)
        if m
    )


def _segments(records: list[CompletionRecord]) -> list[list[str]]:
    groups: dict[str, list[str]] = {}
    for r in records:
        groups.setdefault(r.extra["synthetic_segment"], []).append(r.call_id)
    return sorted(groups.values())


@settings(max_examples=400, deadline=None)
@given(spec=sessions, seed=seeds)
def test_invariants_hold_for_every_generator_and_strategy(spec: SyntheticSpec, seed: int) -> None:
    records = synthetic_session(random.Random(seed), spec, "s")
    by_id = {r.call_id: r for r in records}
    expected = Counter(
        (tok, lp) for r in records for tok, lp in zip(r.response_token_ids, r.response_logprobs, strict=True)
    )
    for strategy in ReconstructionStrategy:
        traces = _reconstruct(records, strategy)
        for trace in traces:
            # Aligned lengths, then the mask-1 invariant and exact_context truthfulness (both directions).
            assert len(trace.response_token_ids) == len(trace.loss_mask) == len(trace.response_logprobs)
            check_trace(trace, by_id)
            assert trace.exact_context == trace_is_exact(trace, by_id)
            if strategy is not ReconstructionStrategy.PREFIX_MERGE:
                assert trace.exact_context, strategy
        assert sorted(c for t in traces for c in t.call_ids) == sorted(by_id), "every call exactly once"
        # Per-request, prefix-merge and exact train on the same multiset of sampled tokens and logprobs.
        assert _sampled(traces) == expected, strategy


@settings(max_examples=150, deadline=None)
@given(spec=sessions, seed=seeds)
def test_prefix_merge_recovers_the_true_segments_when_they_are_unambiguous(spec: SyntheticSpec, seed: int) -> None:
    # Branches share the main agent's prefix and parallel samples share a prompt: each of them is as much a
    # continuation as the calls the generator labelled so, so only the other shapes have one right answer.
    spec = dataclasses.replace(spec, forks=0, parallel_prob=0.0)
    records = synthetic_session(random.Random(seed), spec, "s")
    traces = _reconstruct(records, ReconstructionStrategy.PREFIX_MERGE)
    assert sorted(t.call_ids for t in traces) == _segments(records)


@settings(max_examples=150, deadline=None)
@given(spec=sessions, seed=seeds)
def test_exact_equals_prefix_merge_when_templates_do_not_retokenise(spec: SyntheticSpec, seed: int) -> None:
    spec = dataclasses.replace(spec, retokenize_prob=0.0, forks=0, parallel_prob=0.0)
    records = synthetic_session(random.Random(seed), spec, "s")
    merged = _reconstruct(records, ReconstructionStrategy.PREFIX_MERGE)
    exact = _reconstruct(records, ReconstructionStrategy.EXACT)
    assert [t.to_dict() for t in merged] == [t.to_dict() for t in exact]
    assert all(t.exact_context for t in merged)


@settings(max_examples=150, deadline=None)
@given(spec=sessions, seed=seeds)
def test_exact_splits_exactly_where_prefix_merge_first_loses_the_context(spec: SyntheticSpec, seed: int) -> None:
    spec = dataclasses.replace(spec, forks=0, parallel_prob=0.0)
    records = synthetic_session(random.Random(seed), spec, "s")
    options = ReconstructionOptions(end_of_turn_ids=(IM_END,))
    merged = reconstruct_session(records, options)
    exact = reconstruct_session(records, dataclasses.replace(options, strategy=ReconstructionStrategy.EXACT))
    extra_chains = len(exact.traces) - len(merged.traces)
    assert exact.stats.splits_by_reason.get(SplitReason.INEXACT_CONTEXT, 0) == extra_chains
    assert (extra_chains == 0) == (merged.stats.mismatched_context_calls == 0)
    assert exact.stats.mismatched_context_calls == 0
    # Every merged call counted as mismatched really is trained in a context other than its prompt.
    inexact_calls = sum(1 for t in merged.traces for _ in t.call_ids if not t.exact_context)
    assert merged.stats.mismatched_context_calls <= inexact_calls


def test_each_generator_produces_the_shape_it_is_named_for():
    # Guards the property tests against vacuity: every generator's defining feature actually occurs.
    rng = random.Random(5)
    merge = ReconstructionOptions(end_of_turn_ids=(IM_END,))

    append_only = synthetic_session(rng, SyntheticSpec(turns=6), "a")
    assert len(reconstruct_session(append_only, merge).traces) == 1

    compacted = synthetic_session(rng, SyntheticSpec(turns=6, compaction_every=2), "c")
    assert reconstruct_session(compacted, merge).stats.splits_by_reason == {SplitReason.PREFIX_MISMATCH: 2}

    branched = synthetic_session(rng, SyntheticSpec(turns=6, forks=2, subagent_turns=2), "b")
    main_prompts = [r.prompt_token_ids for r in branched if r.extra["synthetic_segment"].startswith("main")]
    first_fork_calls: dict[str, CompletionRecord] = {}
    for r in branched:
        if r.extra["synthetic_segment"].startswith("fork"):
            first_fork_calls.setdefault(r.extra["synthetic_segment"], r)
    assert len(first_fork_calls) == 2
    for fork in first_fork_calls.values():  # a branch's history starts with the main agent's
        assert any(fork.prompt_token_ids[: len(p)] == p for p in main_prompts)

    parallel = synthetic_session(rng, SyntheticSpec(turns=6, parallel_prob=1.0), "p")
    prompts = Counter(tuple(r.prompt_token_ids) for r in parallel)
    assert all(n >= 2 for n in prompts.values())

    retokenised = synthetic_session(rng, SyntheticSpec(turns=6, response_tokens=8, retokenize_prob=1.0), "r")
    assert reconstruct_session(retokenised, merge).stats.mismatched_context_calls > 0
