"""Padding traces into training tensors: a thin adapter over :mod:`polar_core.export`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from polar_core.convert import trace_from_proto
from polar_core.records import Trace

__all__ = ["as_trace", "traces_to_tensors"]


def as_trace(item: Any) -> Trace:
    """Accept a :class:`Trace`, its JSON object, or a ``polar.common.v1.Trace`` message."""
    if isinstance(item, Trace):
        return item
    if isinstance(item, Mapping):
        return Trace.from_dict(item)
    return trace_from_proto(item)


def traces_to_tensors(
    traces: Iterable[Any], *, pad_token_id: int = 0, max_length: int | None = None, device: str = "cpu"
) -> dict[str, Any]:
    """Pad traces (records, JSON objects or protobuf Traces, e.g. from ``SessionResult.traces``) into tensors.

    Delegates to :func:`polar_core.export.to_padded_tensors` (torch is imported only then). Rows are
    ``prompt_token_ids + response_token_ids``, right-padded; ``loss_mask`` and ``old_logprobs`` cover the whole
    row and are 0 over the prompt and the padding.

    Returns:
        ``input_ids``, ``attention_mask``, ``loss_mask``, ``old_logprobs`` (``[B, T]``) and ``prompt_lengths``,
        ``rewards``, ``weights`` (``[B]``).

    Raises:
        FailedPrecondition: torch is not installed.
        InvalidArgument: No traces, or a malformed one.
    """
    from polar_core.export import to_padded_tensors

    return to_padded_tensors(
        [as_trace(t) for t in traces], pad_token_id=pad_token_id, max_length=max_length, device=device
    )
