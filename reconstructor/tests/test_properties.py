"""Property tests over synthetic sessions with known structure (see ``reconstructor.synthetic``)."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from polar_core.records import CompletionRecord, ReconstructionStrategy
from reconstructor import ReconstructionOptions, SplitReason, reconstruct_session
from reconstructor.synthetic import IM_END, SyntheticSpec, synthetic_session
from reconstructor.verify import check_trace

specs = st.builds(
    SyntheticSpec,
    turns=st.integers(1, 12),
    system_tokens=st.integers(4, 40),
    response_tokens=st.integers(1, 12),
    tool_tokens=st.integers(1, 12),
    retokenize_prob=st.sampled_from([0.0, 0.3, 1.0]),
    truncate_prob=st.sampled_from([0.0, 0.3]),
    compaction_every=st.integers(0, 4),
    subagents=st.integers(0, 3),
    subagent_turns=st.integers(1, 4),
)


def _options(strategy: ReconstructionStrategy) -> ReconstructionOptions:
    return ReconstructionOptions(strategy=strategy, end_of_turn_ids=(IM_END,))


def _segments(records: list[CompletionRecord]) -> list[list[str]]:
    groups: dict[str, list[str]] = {}
    for r in records:
        groups.setdefault(r.extra["synthetic_segment"], []).append(r.call_id)
    return sorted(groups.values())


@settings(max_examples=60, deadline=None)
@given(spec=specs, seed=st.integers(0, 2**32 - 1), strategy=st.sampled_from(list(ReconstructionStrategy)))
def test_every_strategy_keeps_sampled_tokens_and_every_call_once(spec, seed, strategy):
    records = synthetic_session(random.Random(seed), spec, "s")
    result = reconstruct_session(records, _options(strategy))
    by_id = {r.call_id: r for r in records}
    for trace in result.traces:
        check_trace(trace, by_id)
    assert sorted(c for t in result.traces for c in t.call_ids) == sorted(by_id)
    assert result.stats.chains == len(result.traces) == result.stats.calls - result.stats.merges
    assert result.stats.trainable_tokens == sum(len(r.response_token_ids) for r in records)


@settings(max_examples=60, deadline=None)
@given(spec=specs, seed=st.integers(0, 2**32 - 1))
def test_prefix_merge_recovers_the_true_segments(spec, seed):
    records = synthetic_session(random.Random(seed), spec, "s")
    result = reconstruct_session(records, _options(ReconstructionStrategy.PREFIX_MERGE))
    assert sorted(t.call_ids for t in result.traces) == _segments(records)


@settings(max_examples=60, deadline=None)
@given(spec=specs, seed=st.integers(0, 2**32 - 1))
def test_exact_equals_prefix_merge_when_templates_do_not_retokenise(spec, seed):
    records = synthetic_session(random.Random(seed), dataclasses.replace(spec, retokenize_prob=0.0), "s")
    merged = reconstruct_session(records, _options(ReconstructionStrategy.PREFIX_MERGE))
    exact = reconstruct_session(records, _options(ReconstructionStrategy.EXACT))
    assert [t.to_dict() for t in merged.traces] == [t.to_dict() for t in exact.traces]
    assert all(t.exact_context for t in merged.traces)
    assert merged.stats.mismatched_context_calls == 0


@settings(max_examples=60, deadline=None)
@given(spec=specs, seed=st.integers(0, 2**32 - 1))
def test_exact_never_merges_a_mismatched_context(spec, seed):
    records = synthetic_session(random.Random(seed), spec, "s")
    merged = reconstruct_session(records, _options(ReconstructionStrategy.PREFIX_MERGE))
    exact = reconstruct_session(records, _options(ReconstructionStrategy.EXACT))
    assert all(t.exact_context for t in exact.traces)
    assert exact.stats.mismatched_context_calls == 0
    # Exact splits only where prefix-merge would have merged with a mismatched context.
    extra_chains = len(exact.traces) - len(merged.traces)
    assert exact.stats.splits_by_reason.get(SplitReason.INEXACT_CONTEXT, 0) == extra_chains
    assert (extra_chains == 0) == (merged.stats.mismatched_context_calls == 0)
