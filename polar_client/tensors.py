"""Padding traces into training tensors: a thin adapter over :mod:`reconstructor.export`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from polar_core.records import Trace

__all__ = ["as_trace", "traces_to_tensors"]


def as_trace(item: Any) -> Trace:
    """Accept a :class:`Trace`, its JSON object, or a ``polar.common.v1.Trace`` message."""
    if isinstance(item, Trace):
        return item
    if isinstance(item, Mapping):
        return Trace.from_dict(item)
    return Trace(
        session_id=item.session_id,
        task_id=item.task_id,
        trace_index=item.trace_index,
        call_ids=list(item.call_ids),
        prompt_token_ids=list(item.prompt_token_ids),
        response_token_ids=list(item.response_token_ids),
        loss_mask=list(item.loss_mask),
        response_logprobs=list(item.response_logprobs),
        reward=item.reward,
        weight=item.weight,
        status=item.status,
        exact_context=item.exact_context,
        policy_versions=list(item.policy_versions),
    )


def traces_to_tensors(
    traces: Iterable[Any], *, pad_token_id: int = 0, max_length: int | None = None, device: str = "cpu"
) -> dict[str, Any]:
    """Pad traces (records, JSON objects or protobuf Traces, e.g. from ``SessionResult.traces``) into tensors.

    Delegates to :func:`reconstructor.export.to_padded_tensors` (torch is imported only then). Rows are
    ``prompt_token_ids + response_token_ids``, right-padded; ``loss_mask`` and ``old_logprobs`` cover the whole
    row and are 0 over the prompt and the padding.

    Returns:
        ``input_ids``, ``attention_mask``, ``loss_mask``, ``old_logprobs`` (``[B, T]``) and ``prompt_lengths``,
        ``rewards``, ``weights`` (``[B]``).

    Raises:
        FailedPrecondition: torch is not installed.
        InvalidArgument: No traces, or a malformed one.
    """
    from reconstructor.export import to_padded_tensors

    return to_padded_tensors(
        [as_trace(t) for t in traces], pad_token_id=pad_token_id, max_length=max_length, device=device
    )
