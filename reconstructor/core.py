"""Reconstruction: a session's completion records in, trainer-facing traces and statistics out.

The invariant every strategy keeps: each trainable (mask 1) token of a trace is a token the policy sampled,
carrying the behaviour logprob it was sampled with; everything else has mask 0 and a 0.0 placeholder. No
text is ever re-encoded. How calls are grouped into traces is described in :mod:`reconstructor.chains`; the
records taken and returned live in :mod:`reconstructor.models` (re-exported here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from polar_core.records import CompletionRecord, ReconstructionStats, ReconstructionStrategy, Trace
from reconstructor.chains import Chain, ChainBuilder, PreparedCall, prepare
from reconstructor.eot import detect_end_of_turn_ids
from reconstructor.errors import MalformedCompletions
from reconstructor.models import ReconstructionOptions, ReconstructionResult, SessionOutcome
from reconstructor.trace_weights import trace_weights

__all__ = [
    "ABORTED",
    "ReconstructionOptions",
    "ReconstructionResult",
    "SessionOutcome",
    "build_chains",
    "reconstruct",
    "reconstruct_session",
]


ABORTED = "abort"
"""The ``finish_reason`` of a call that was cut before it finished; such calls are never trained on."""


def reconstruct_session(
    records: Iterable[CompletionRecord],
    options: ReconstructionOptions | None = None,
    outcome: SessionOutcome | None = None,
) -> ReconstructionResult:
    """Reconstruct the traces of one session.

    Records are visited in ``seq`` order whatever order they are given in. Aborted calls (``finish_reason``
    ``abort``: cut by a weight update's pause, or the harness went away) are left out of every trace and
    counted in ``stats.aborted_calls``: the harness never received them as responses. Sessions whose status
    carries no learning signal (``infra_error``, ``cancelled``) keep their traces for inspection, with every mask
    entry and logprob 0, so no trainer can learn from an infrastructure failure; their weights follow the
    weighting mode like any other session's.

    Args:
        records: The session's completion records.
        options: The reconstruction options; defaults to prefix merging with detected end-of-turn IDs.
        outcome: The session's task id, reward and status.

    Returns:
        The traces and statistics.

    Raises:
        MalformedCompletions: The records name several sessions or repeat a call id.
    """
    options = options or ReconstructionOptions()
    outcome = outcome or SessionOutcome()
    read = _ordered_session(records)
    ordered = [r for r in read if r.finish_reason != ABORTED]
    stats = ReconstructionStats(calls=len(read), aborted_calls=len(read) - len(ordered))
    if not ordered:
        return ReconstructionResult([], stats)
    eot = options.end_of_turn_ids
    if not eot and options.strategy is ReconstructionStrategy.PREFIX_MERGE:
        eot = detect_end_of_turn_ids(ordered)
    builder = build_chains(prepare(ordered), options, eot)
    trainable = outcome.status.trainable
    weights = trace_weights(len(builder.chains), options.weighting)
    traces = [
        _to_trace(chain, index, outcome, weight, trainable)
        for index, (chain, weight) in enumerate(zip(builder.chains, weights, strict=True))
    ]
    stats.chains = len(traces)
    stats.merges = builder.merges
    for reason in builder.splits:
        stats.count_split(reason)
    stats.mismatched_context_calls = builder.mismatched_calls
    stats.mismatched_context_tokens = builder.mismatched_tokens
    stats.trainable_tokens = sum(sum(t.loss_mask) for t in traces)
    stats.total_tokens = sum(len(t.prompt_token_ids) + len(t.response_token_ids) for t in traces)
    return ReconstructionResult(traces, stats)


def build_chains(calls: Iterable[PreparedCall], options: ReconstructionOptions, eot: Sequence[int]) -> ChainBuilder:
    """Assign prepared calls (one session, in seq order) to chains; the chain-building phase alone.

    Args:
        calls: The session's calls, converted by :func:`~reconstructor.chains.prepare`, in seq order.
        options: The reconstruction options.
        eot: The end-of-turn IDs to use (``options.end_of_turn_ids`` or detected ones).

    Returns:
        The builder, holding the chains and the counters.
    """
    builder = ChainBuilder(
        options.strategy,
        eot,
        split_on_policy_version=options.split_on_policy_version,
        prefer_exact_context=options.prefer_exact_context,
    )
    for call in calls:
        builder.add(call)
    return builder


def reconstruct(
    records: Iterable[CompletionRecord],
    options: ReconstructionOptions | None = None,
    outcomes: Mapping[str, SessionOutcome] | None = None,
) -> ReconstructionResult:
    """Reconstruct the traces of every session in ``records`` (for example a whole ``completions.jsonl``).

    Args:
        records: Completion records of any number of sessions, in any order.
        options: The reconstruction options.
        outcomes: Each session's task id, reward and status by session id; missing sessions get
            :class:`SessionOutcome` defaults.

    Returns:
        The traces of all sessions (sessions in order of first appearance) and the combined statistics.
    """
    by_session: dict[str, list[CompletionRecord]] = {}
    for record in records:
        by_session.setdefault(record.session_id, []).append(record)
    outcomes = outcomes or {}
    options = options or ReconstructionOptions()
    if not options.end_of_turn_ids and options.strategy is ReconstructionStrategy.PREFIX_MERGE:
        # Detected once over every session: a short session alone may not show its end-of-turn token.
        detected = detect_end_of_turn_ids(r for recs in by_session.values() for r in recs)
        options = dataclasses.replace(options, end_of_turn_ids=detected)
    results = [reconstruct_session(recs, options, outcomes.get(sid)) for sid, recs in by_session.items()]
    return ReconstructionResult(
        traces=[t for r in results for t in r.traces],
        stats=ReconstructionStats.combine(r.stats for r in results),
    )


def _ordered_session(records: Iterable[CompletionRecord]) -> list[CompletionRecord]:
    ordered = sorted(records, key=lambda r: r.seq)
    if not ordered:
        return ordered
    sessions = {r.session_id for r in ordered}
    if len(sessions) > 1:
        raise MalformedCompletions(
            f"one reconstruction got completions of {len(sessions)} sessions",
            details={"sessions": "|".join(sorted(sessions))},
        )
    seen: set[str] = set()
    for r in ordered:
        if r.call_id in seen:
            raise MalformedCompletions(
                f"call id {r.call_id!r} appears twice in session {r.session_id!r}",
                details={"call_id": r.call_id, "session_id": r.session_id},
            )
        seen.add(r.call_id)
    return ordered


def _distinct(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def _to_trace(chain: Chain, index: int, outcome: SessionOutcome, weight: float, trainable: bool) -> Trace:
    n = len(chain.tokens)
    records = [c.record for c in chain.calls]
    return Trace(
        session_id=records[0].session_id,
        task_id=outcome.task_id,
        trace_index=index,
        call_ids=[r.call_id for r in records],
        prompt_token_ids=list(records[0].prompt_token_ids),
        response_token_ids=chain.tokens,
        loss_mask=chain.mask if trainable else [0] * n,
        response_logprobs=chain.logprobs if trainable else [0.0] * n,
        reward=outcome.reward,
        weight=weight,
        status=outcome.status.value,
        exact_context=chain.exact_context,
        policy_versions=_distinct([r.policy_version for r in records]),
    )
