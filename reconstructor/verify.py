"""An independent check of a trace against the completions it claims to be built from.

It re-derives, from the records alone, what the invariant requires: the trainable positions of a trace are
exactly its calls' sampled IDs with their behaviour logprobs, in order, each call's span contiguous; every
other position has logprob 0.0; the three response arrays are aligned; and ``exact_context`` is true exactly
when each call that sampled tokens sits right after a context equal to the prompt it was sampled with. Tests
use it on every strategy, and a trainer can run it on data it did not produce.
"""

from __future__ import annotations

from collections.abc import Mapping

from polar_core.errors import Internal
from polar_core.records import CompletionRecord, TerminalStatus, Trace

__all__ = ["check_trace", "trace_is_exact"]


def trace_is_exact(trace: Trace, records: Mapping[str, CompletionRecord]) -> bool:
    """Return whether every sampled token of ``trace`` follows exactly the context it was sampled with.

    Positions are recovered from the mask: call ``m``'s sampled span starts at the mask-1 position that
    follows the sampled tokens of calls ``1..m-1``. Only meaningful for traces whose masks are not all
    zeroed (see :func:`check_trace`).
    """
    calls = [records[c] for c in trace.call_ids]
    full = trace.prompt_token_ids + trace.response_token_ids
    offset = len(trace.prompt_token_ids)
    trainable = [i for i, m in enumerate(trace.loss_mask) if m]
    seen = 0
    for call in calls:
        n = len(call.response_token_ids)
        if not n:
            continue
        start = offset + trainable[seen]
        seen += n
        if full[:start] != call.prompt_token_ids:
            return False
    return True


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
    n = len(trace.response_token_ids)
    if len(trace.loss_mask) != n or len(trace.response_logprobs) != n:
        raise Internal(f"{where}: response, loss_mask and response_logprobs are not aligned")
    if set(trace.loss_mask) - {0, 1}:
        raise Internal(f"{where}: the loss mask holds values other than 0 and 1")
    if trace.prompt_token_ids != calls[0].prompt_token_ids:
        raise Internal(f"{where}: prompt differs from its first call's prompt")
    if any(lp != 0.0 for lp, m in zip(trace.response_logprobs, trace.loss_mask, strict=True) if not m):
        raise Internal(f"{where}: a mask-0 position has a non-zero logprob")
    if not TerminalStatus(trace.status).trainable:
        if any(trace.loss_mask):
            raise Internal(f"{where}: a {trace.status} trace has trainable tokens")
        return
    trainable = [i for i, m in enumerate(trace.loss_mask) if m]
    sampled = [trace.response_token_ids[i] for i in trainable]
    logprobs = [trace.response_logprobs[i] for i in trainable]
    if sampled != [t for c in calls for t in c.response_token_ids]:
        raise Internal(f"{where}: trainable tokens are not exactly the calls' sampled tokens")
    if logprobs != [lp for c in calls for lp in c.response_logprobs]:
        raise Internal(f"{where}: trainable logprobs are not the behaviour logprobs")
    if calls[0].response_token_ids and trainable[0] != 0:
        raise Internal(f"{where}: the first call's sampled span does not follow the prompt")
    seen = 0
    for call in calls:
        span = trainable[seen : seen + len(call.response_token_ids)]
        if span and span[-1] - span[0] != len(span) - 1:
            raise Internal(f"{where}: call {call.call_id}'s sampled span is interrupted")
        seen += len(span)
    if trace.exact_context != trace_is_exact(trace, records):
        raise Internal(f"{where}: exact_context={trace.exact_context} is not true of the trace")
