"""An independent check of a trace against the completions it claims to be built from.

It re-derives, from the records alone, what the invariant requires: the trainable positions of a trace are
exactly its calls' sampled IDs with their behaviour logprobs, in order; every other position has logprob
0.0; and, when the trace claims ``exact_context``, each call's sampled span sits right after a context equal
to the prompt it was sampled with. Tests use it on every strategy, and a trainer can run it on data it did
not produce.
"""

from __future__ import annotations

from collections.abc import Mapping

from polar_core.errors import Internal
from polar_core.records import CompletionRecord, TerminalStatus, Trace

__all__ = ["check_trace"]


def check_trace(trace: Trace, records: Mapping[str, CompletionRecord]) -> None:
    """Raise :class:`~polar_core.errors.Internal` when ``trace`` breaks the token-faithfulness invariant.

    Args:
        trace: The trace to check.
        records: Completion records by call id; must contain every id in ``trace.call_ids``.
    """
    calls = [records[c] for c in trace.call_ids]
    where = f"trace {trace.session_id}/{trace.trace_index}"
    if not calls:
        raise Internal(f"{where}: no calls")
    if trace.prompt_token_ids != calls[0].prompt_token_ids:
        raise Internal(f"{where}: prompt differs from its first call's prompt")
    if any(lp != 0.0 for lp, m in zip(trace.response_logprobs, trace.loss_mask, strict=True) if not m):
        raise Internal(f"{where}: a mask-0 position has a non-zero logprob")
    if not TerminalStatus(trace.status).trainable:
        if any(trace.loss_mask):
            raise Internal(f"{where}: a {trace.status} trace has trainable tokens")
        return
    sampled = [t for t, m in zip(trace.response_token_ids, trace.loss_mask, strict=True) if m]
    logprobs = [lp for lp, m in zip(trace.response_logprobs, trace.loss_mask, strict=True) if m]
    if sampled != [t for c in calls for t in c.response_token_ids]:
        raise Internal(f"{where}: trainable tokens are not exactly the calls' sampled tokens")
    if logprobs != [lp for c in calls for lp in c.response_logprobs]:
        raise Internal(f"{where}: trainable logprobs are not the behaviour logprobs")
    if trace.exact_context:
        full = trace.prompt_token_ids + trace.response_token_ids
        for call in calls:
            start = len(call.prompt_token_ids)
            end = start + len(call.response_token_ids)
            if full[:start] != call.prompt_token_ids or full[start:end] != call.response_token_ids:
                raise Internal(f"{where}: call {call.call_id} does not follow its own prompt")
            if not all(trace.loss_mask[start - len(trace.prompt_token_ids) : end - len(trace.prompt_token_ids)]):
                raise Internal(f"{where}: call {call.call_id}'s sampled span is not trainable")
