from __future__ import annotations

import pytest

from polar_core.errors import InvalidArgument
from polar_core.records import CompletionRecord, ReconstructionStrategy, TerminalStatus
from reconstructor import (
    MalformedCompletions,
    ReconstructionOptions,
    ReconstructionResult,
    SessionOutcome,
    SplitReason,
    WeightingMode,
    reconstruct,
    reconstruct_session,
)
from reconstructor.verify import check_trace

EOT = 99
PREFIX = ReconstructionOptions(strategy=ReconstructionStrategy.PREFIX_MERGE, end_of_turn_ids=(EOT,))
EXACT = ReconstructionOptions(strategy=ReconstructionStrategy.EXACT)
PER_REQUEST = ReconstructionOptions(strategy=ReconstructionStrategy.PER_REQUEST)


def rec(
    seq: int,
    prompt: list[int],
    response: list[int],
    *,
    session: str = "s",
    parent: str | None = None,
    version: str = "v1",
    finish: str = "stop",
    call_id: str | None = None,
) -> CompletionRecord:
    return CompletionRecord(
        session_id=session,
        call_id=call_id or f"c{seq}",
        seq=seq,
        prompt_token_ids=list(prompt),
        response_token_ids=list(response),
        response_logprobs=[-0.1 * (seq + 1) - 0.01 * i for i in range(len(response))],
        parent_call_id=parent,
        policy_version=version,
        finish_reason=finish,
    )


def check_all(result: ReconstructionResult, records: list[CompletionRecord]) -> None:
    by_id = {r.call_id: r for r in records}
    for trace in result.traces:
        check_trace(trace, by_id)
    merged = [c for t in result.traces for c in t.call_ids]
    kept = [i for i, r in by_id.items() if r.finish_reason != "abort"]
    assert sorted(merged) == sorted(kept), "every call but the aborted ones appears in exactly one trace"


def test_review_hand_worked_example():
    # Review §5.5: a1=[20] renders canonically as [21, 22]; the merge keeps 20 and masks the inserted tokens.
    records = [rec(0, [10], [20]), rec(1, [10, 21, 22, 99, 30], [40, 99])]
    result = reconstruct_session(records, PREFIX)
    (trace,) = result.traces
    assert trace.prompt_token_ids == [10]
    assert trace.response_token_ids == [20, 99, 30, 40, 99]
    assert trace.loss_mask == [1, 0, 0, 1, 1]
    assert trace.response_logprobs == [*records[0].response_logprobs, 0.0, 0.0, *records[1].response_logprobs]
    assert trace.exact_context is False
    assert result.stats.mismatched_context_calls == 1
    assert result.stats.mismatched_context_tokens == 2
    check_all(result, records)


def test_sampled_end_of_turn_is_not_duplicated():
    p1 = [5, 6]
    a1 = [20, 21, EOT]
    p2 = [*p1, 20, 21, EOT, 30, 31]  # canonical rendering equals the sampled one
    result = reconstruct_session([rec(0, p1, a1), rec(1, p2, [40, EOT])], PREFIX)
    (trace,) = result.traces
    assert trace.response_token_ids == [20, 21, EOT, 30, 31, 40, EOT]
    assert trace.loss_mask == [1, 1, 1, 0, 0, 1, 1]
    assert trace.exact_context is True
    assert result.stats.merges == 1
    assert result.stats.mismatched_context_calls == 0
    assert result.stats.trainable_tokens == 5
    assert result.stats.total_tokens == 2 + 7


def test_truncated_response_keeps_template_end_of_turn_masked():
    p1 = [5]
    a1 = [20, 21]  # cut by the length limit: no sampled end-of-turn
    p2 = [5, 20, 21, EOT, 30]
    (trace,) = reconstruct_session([rec(0, p1, a1, finish="length"), rec(1, p2, [40])], PREFIX).traces
    assert trace.response_token_ids == [20, 21, EOT, 30, 40]
    assert trace.loss_mask == [1, 1, 0, 0, 1]
    assert trace.exact_context is True


def test_per_request_gives_one_exact_trace_per_call():
    records = [rec(0, [10], [20]), rec(1, [10, 21, 22, 99, 30], [40, 99])]
    result = reconstruct_session(records, PER_REQUEST)
    assert [t.call_ids for t in result.traces] == [["c0"], ["c1"]]
    assert all(t.exact_context for t in result.traces)
    assert all(all(t.loss_mask) for t in result.traces)
    assert result.stats.merges == 0
    check_all(result, records)


def test_exact_strategy_refuses_retokenised_context():
    records = [rec(0, [10], [20]), rec(1, [10, 21, 22, 99, 30], [40, 99])]
    result = reconstruct_session(records, EXACT)
    assert len(result.traces) == 2
    assert result.stats.splits_by_reason == {SplitReason.INEXACT_CONTEXT: 1}
    assert all(t.exact_context for t in result.traces)


def test_exact_strategy_merges_identical_context_without_end_of_turn_ids():
    records = [rec(0, [10], [20, EOT]), rec(1, [10, 20, EOT, 30], [40, EOT])]
    result = reconstruct_session(records, EXACT)
    (trace,) = result.traces
    assert trace.response_token_ids == [20, EOT, 30, 40, EOT]
    assert trace.loss_mask == [1, 1, 0, 1, 1]
    check_all(result, records)


def test_compaction_and_subagent_split_into_separate_chains():
    main1 = rec(0, [1, 2], [20, EOT])
    sub1 = rec(1, [7, 8], [60, EOT])
    main2 = rec(2, [1, 2, 20, EOT, 30], [21, EOT])
    sub2 = rec(3, [7, 8, 60, EOT, 70], [61, EOT])
    compacted = rec(4, [1, 5, 6], [22, EOT])
    records = [main1, sub1, main2, sub2, compacted]
    result = reconstruct_session(records, PREFIX)
    assert [t.call_ids for t in result.traces] == [["c0", "c2"], ["c1", "c3"], ["c4"]]
    assert result.stats.splits_by_reason == {SplitReason.PREFIX_MISMATCH: 2}
    assert result.stats.chains == 3
    assert result.stats.merges == 2
    check_all(result, records)


def test_parallel_samples_with_identical_prompts_start_separate_chains():
    p = [1, 2]
    a = rec(0, p, [20, EOT])
    b = rec(1, p, [30, EOT])  # same prompt: a retry or a parallel sample
    cont = rec(2, [1, 2, 30, EOT, 40], [50, EOT])  # continues b, which is also the most recent
    result = reconstruct_session([a, b, cont], PREFIX)
    assert [t.call_ids for t in result.traces] == [["c0"], ["c1", "c2"]]
    assert result.stats.splits_by_reason == {SplitReason.REPEATED_PROMPT: 1}
    assert result.traces[1].exact_context
    check_all(result, [a, b, cont])


def test_equal_prefixes_go_to_the_most_recent_chain_even_when_its_context_differs():
    # The call continues a (it renders 20), but Polar's order does not look at contexts: with equal prefix
    # lengths the most recent chain wins, and the trace says its context is not exact.
    a, b = rec(0, [1, 2], [20, EOT]), rec(1, [1, 2], [30, EOT])
    cont = rec(2, [1, 2, 20, EOT, 40], [50, EOT])
    result = reconstruct_session([a, b, cont], PREFIX)
    assert [t.call_ids for t in result.traces] == [["c0"], ["c1", "c2"]]
    assert [t.exact_context for t in result.traces] == [True, False]
    assert (result.stats.mismatched_context_calls, result.stats.mismatched_context_tokens) == (1, 2)
    check_all(result, [a, b, cont])
    # prefer_exact_context is an opt-in departure from Polar's order; exact never merges a mismatch.
    preferring = ReconstructionOptions(end_of_turn_ids=(EOT,), prefer_exact_context=True)
    assert [t.call_ids for t in reconstruct_session([a, b, cont], preferring).traces] == [["c0", "c2"], ["c1"]]
    assert [t.call_ids for t in reconstruct_session([a, b, cont], EXACT).traces] == [["c0", "c2"], ["c1"]]


def test_most_recent_means_the_chain_extended_last():
    c0, c1 = rec(0, [1], [20, EOT]), rec(1, [1], [21, EOT])  # two samples: chains A (c0) then B (c1)
    c2 = rec(2, [1, 21, EOT, 3], [22, EOT], parent="c1")  # B continues
    c3 = rec(3, [1, 21, EOT, 3], [24, EOT])  # repeats c2's prompt, so only A qualifies: A is extended last
    c4 = rec(4, [1, 21, EOT, 3, 24, EOT, 5], [25, EOT])  # A and B end in equal prompts
    result = reconstruct_session([c0, c1, c2, c3, c4], PREFIX)
    assert [t.call_ids for t in result.traces] == [["c0", "c3", "c4"], ["c1", "c2"]]
    check_all(result, [c0, c1, c2, c3, c4])


def test_longest_prefix_wins_over_a_more_recent_shorter_one():
    first = rec(0, [1, 2], [20, EOT])
    second = rec(1, [1, 2, 20, EOT, 3], [21, EOT])  # extends the first chain: its last prompt is now longer
    late = rec(2, [1, 2], [22, EOT])  # a late parallel sample of the first prompt: newest chain
    cont = rec(3, [1, 2, 20, EOT, 3, 21, EOT, 4], [23, EOT])  # both chains' last prompts prefix it
    result = reconstruct_session([first, second, late, cont], PREFIX)
    assert [t.call_ids for t in result.traces] == [["c0", "c1", "c3"], ["c2"]]
    assert all(t.exact_context for t in result.traces)


def test_parent_call_id_wins_over_a_longer_prefix_and_recency():
    first = rec(0, [1, 2], [20, EOT])
    second = rec(1, [1, 2, 20, EOT, 3], [21, EOT])
    late = rec(2, [1, 2], [22, EOT])
    # Names the short, older-extended chain (c2) as its parent although c1's longer prompt prefixes it too.
    cont = rec(3, [1, 2, 20, EOT, 3, 21, EOT, 4], [23, EOT], parent="c2")
    result = reconstruct_session([first, second, late, cont], PREFIX)
    assert [t.call_ids for t in result.traces] == [["c0", "c1"], ["c2", "c3"]]
    assert result.traces[1].exact_context is False  # c3 was not sampled after c2's tokens
    check_all(result, [first, second, late, cont])


def test_parent_call_id_wins_over_other_candidates():
    p = [1, 2]
    a = rec(0, p, [20])
    b = rec(1, p, [30])
    # Both chains' last prompt prefixes it and neither is exact; the named parent decides.
    cont = rec(2, [1, 2, 31, EOT, 40], [50, EOT], parent="c0")
    result = reconstruct_session([a, b, cont], PREFIX)
    assert [t.call_ids for t in result.traces] == [["c0", "c2"], ["c1"]]


def test_an_unsafe_boundary_of_the_preferred_chain_splits_instead_of_trying_another():
    first = rec(0, [1], [20, EOT])
    second = rec(1, [1, 20, EOT, 3], [21], finish="length")
    # The longest candidate is (c0, c1): its tail [4] has no end-of-turn. The shorter chain (c2) would
    # accept it, but choosing it would be a guess.
    late = rec(2, [1], [22, EOT])
    cont = rec(3, [1, 20, EOT, 3, 4], [23, EOT])
    result = reconstruct_session([first, second, late, cont], PREFIX)
    assert [t.call_ids for t in result.traces] == [["c0", "c1"], ["c2"], ["c3"]]
    assert result.stats.splits_by_reason == {SplitReason.PREFIX_MISMATCH: 1, SplitReason.NO_END_OF_TURN: 1}


def test_end_of_turn_inside_the_sampled_response_is_a_malformed_boundary():
    # a1 holds an end-of-turn before its end: the first one in the tail may belong to a1's rendering.
    records = [rec(0, [1], [20, EOT, 21, EOT]), rec(1, [1, 20, EOT, 21, EOT, 30], [40, EOT])]
    result = reconstruct_session(records, PREFIX)
    assert [t.call_ids for t in result.traces] == [["c0"], ["c1"]]
    assert result.stats.splits_by_reason == {SplitReason.MALFORMED_TAIL: 1}


def test_template_terminator_other_than_the_sampled_one_is_kept():
    # Two end-of-turn IDs: the response stopped on 98, the template closes the turn with 99.
    options = ReconstructionOptions(end_of_turn_ids=(98, 99))
    records = [rec(0, [1], [20, 98]), rec(1, [1, 20, 99, 30], [40, 99])]
    (trace,) = reconstruct_session(records, options).traces
    assert trace.response_token_ids == [20, 98, 99, 30, 40, 99]
    assert trace.loss_mask == [1, 1, 0, 0, 1, 1]
    assert trace.exact_context is False


def test_an_empty_response_does_not_make_trainable_context_inexact():
    # c1 sampled nothing (aborted, so left out); the chain still continues through its prompt.
    records = [rec(0, [1], [20, EOT]), rec(1, [1, 20, EOT, 3], [], finish="abort"), rec(2, [1, 20, EOT, 3, 4], [5])]
    result = reconstruct_session(records, ReconstructionOptions(end_of_turn_ids=(EOT,)))
    check_all(result, records)
    assert [t.exact_context for t in result.traces] == [True] * len(result.traces)


def test_tail_without_end_of_turn_is_an_unsafe_boundary():
    records = [rec(0, [1], [20]), rec(1, [1, 20, 30], [40])]
    result = reconstruct_session(records, PREFIX)
    assert len(result.traces) == 2
    assert result.stats.splits_by_reason == {SplitReason.NO_END_OF_TURN: 1}


def test_chains_split_at_policy_versions_by_default_with_an_opt_out():
    records = [rec(0, [1], [20, EOT], version="v1"), rec(1, [1, 20, EOT, 3], [21, EOT], version="v2")]
    split = reconstruct_session(records, PREFIX)
    assert [t.policy_versions for t in split.traces] == [["v1"], ["v2"]]
    assert split.stats.splits_by_reason == {SplitReason.POLICY_VERSION: 1}
    opt_out = ReconstructionOptions(end_of_turn_ids=(EOT,), split_on_policy_version=False)
    merged = reconstruct_session(records, opt_out)
    assert [t.policy_versions for t in merged.traces] == [["v1", "v2"]]
    same = [rec(0, [1], [20, EOT], version="v1"), rec(1, [1, 20, EOT, 3], [21, EOT], version="v1")]
    assert len(reconstruct_session(same, PREFIX).traces) == 1  # one version: nothing to split


@pytest.mark.parametrize("status", [TerminalStatus.INFRA_ERROR, TerminalStatus.CANCELLED])
def test_untrainable_status_masks_everything(status):
    records = [rec(0, [1], [20, EOT]), rec(1, [1, 20, EOT, 3], [21, EOT])]
    outcome = SessionOutcome(task_id="t", reward=0.0, status=status)
    result = reconstruct_session(records, PREFIX, outcome)
    (trace,) = result.traces
    assert trace.status == status.value
    assert set(trace.loss_mask) == {0}
    assert set(trace.response_logprobs) == {0.0}
    assert trace.weight == 1.0  # session normalisation still holds; the zero mask is what excludes it
    assert result.stats.trainable_tokens == 0
    check_all(result, records)


def test_outcome_and_weights_are_written_on_traces():
    records = [rec(0, [1], [20, EOT]), rec(1, [9], [21, EOT])]
    outcome = SessionOutcome(task_id="task-7", reward=1.0, status=TerminalStatus.RESOLVED)
    session = reconstruct_session(records, PREFIX, outcome)
    assert [t.weight for t in session.traces] == [0.5, 0.5]
    assert {(t.task_id, t.reward, t.status) for t in session.traces} == {("task-7", 1.0, "resolved")}
    per_trace = reconstruct_session(records, ReconstructionOptions(weighting=WeightingMode.TRACE), outcome)
    assert [t.weight for t in per_trace.traces] == [1.0, 1.0]


def test_records_are_visited_in_seq_order():
    records = [rec(1, [1, 20, EOT, 3], [21, EOT]), rec(0, [1], [20, EOT])]
    (trace,) = reconstruct_session(records, PREFIX).traces
    assert trace.call_ids == ["c0", "c1"]


def test_end_of_turn_is_detected_from_finished_responses():
    records = [rec(0, [1], [20, EOT]), rec(1, [1, 20, EOT, 3], [21, EOT])]
    (trace,) = reconstruct_session(records, ReconstructionOptions()).traces
    assert trace.loss_mask == [1, 1, 0, 1, 1]


def test_unknown_end_of_turn_splits_instead_of_guessing():
    truncated = [rec(0, [1], [20], finish="length"), rec(1, [1, 20, EOT, 3], [21], finish="length")]
    result = reconstruct_session(truncated, ReconstructionOptions())
    assert [t.call_ids for t in result.traces] == [["c0"], ["c1"]]
    assert result.stats.splits_by_reason == {"no_end_of_turn": 1}
    unrelated = [rec(0, [1], [20], finish="length"), rec(1, [2], [21], finish="length")]
    assert len(reconstruct_session(unrelated, ReconstructionOptions()).traces) == 2


def test_malformed_inputs_are_rejected_as_invalid_arguments():
    with pytest.raises(MalformedCompletions):
        reconstruct_session([rec(0, [1], [2]), rec(1, [1], [2], call_id="c0")], PREFIX)
    with pytest.raises(MalformedCompletions):
        reconstruct_session([rec(0, [1], [2]), rec(1, [1], [2], session="other")], PREFIX)
    assert issubclass(MalformedCompletions, InvalidArgument)
    assert reconstruct_session([], PREFIX).traces == []


def test_reconstruct_groups_sessions_and_combines_stats():
    records = [
        rec(0, [1], [20, EOT], session="a", call_id="a0"),
        rec(0, [1], [20, EOT], session="b", call_id="b0"),
        rec(1, [1, 20, EOT, 3], [21, EOT], session="a", call_id="a1"),
        rec(1, [4], [21, EOT], session="b", call_id="b1"),
    ]
    outcomes = {"a": SessionOutcome(task_id="t", reward=1.0), "b": SessionOutcome(task_id="t", reward=0.0)}
    result = reconstruct(records, PREFIX, outcomes)
    assert [(t.session_id, t.trace_index, t.reward) for t in result.traces] == [
        ("a", 0, 1.0),
        ("b", 0, 0.0),
        ("b", 1, 0.0),
    ]
    assert result.stats.calls == 4
    assert result.stats.chains == 3
    assert result.stats.merges == 1
    assert result.stats.splits_by_reason == {SplitReason.PREFIX_MISMATCH: 1}


@pytest.mark.parametrize("options", [PREFIX, EXACT, PER_REQUEST])
def test_aborted_calls_are_left_out_and_counted(options: ReconstructionOptions) -> None:
    # The second call was cut by a weight update (finish "abort"); the harness retried it with the same prompt.
    records = [
        rec(0, [10], [20, 99]),
        rec(1, [10, 20, 99, 30], [77, 78], finish="abort"),
        rec(2, [10, 20, 99, 30], [40, 99]),
    ]
    result = reconstruct_session(records, options)
    assert result.stats.calls == 3
    assert result.stats.aborted_calls == 1
    assert result.stats.calls == result.stats.chains + result.stats.merges + result.stats.aborted_calls
    assert all("c1" not in t.call_ids for t in result.traces)
    assert all(77 not in t.response_token_ids and 77 not in t.prompt_token_ids for t in result.traces)
    assert reconstruct([*records, rec(0, [5], [6], session="t")], options).stats.aborted_calls == 1


def test_a_session_of_aborted_calls_only_has_no_trace() -> None:
    result = reconstruct_session([rec(0, [10], [20], finish="abort")], PREFIX)
    assert result.traces == []
    assert (result.stats.calls, result.stats.aborted_calls) == (1, 1)
