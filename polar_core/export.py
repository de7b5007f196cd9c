"""Trace export for trainers: Parquet files, and padded arrays or torch tensors for a training step.

Padded layout (one row per trace, right-padded to the longest row)::

    input_ids        prompt ‖ response ‖ pad
    attention_mask   1 over prompt and response, 0 over padding
    loss_mask        0 over prompt and padding, the trace's loss_mask over the response
    old_logprobs     0.0 except at loss-mask positions, where it is the behaviour logprob of that token

Position ``i`` of ``loss_mask``/``old_logprobs`` describes token ``input_ids[i]``, which a causal LM predicts
from the logits at ``i - 1``. torch is an optional dependency (``pip install polar-rollout[torch]``) and is
imported only by :func:`to_padded_tensors`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from polar_core.errors import FailedPrecondition, InvalidArgument
from polar_core.records import Trace

if TYPE_CHECKING:
    import torch

__all__ = [
    "TRACE_SCHEMA",
    "PaddedBatch",
    "read_parquet",
    "to_padded_arrays",
    "to_padded_tensors",
    "traces_to_table",
    "write_parquet",
]

TRACE_SCHEMA = pa.schema(
    [
        ("session_id", pa.string()),
        ("task_id", pa.string()),
        ("trace_index", pa.int32()),
        ("call_ids", pa.list_(pa.string())),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("response_token_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("response_logprobs", pa.list_(pa.float64())),
        ("reward", pa.float64()),
        ("weight", pa.float64()),
        ("status", pa.string()),
        ("exact_context", pa.bool_()),
        ("policy_versions", pa.list_(pa.string())),
    ]
)
"""The Parquet schema of a trace; column names are the contract's field names."""

_NUMERIC_LISTS: dict[str, type[np.generic]] = {
    "prompt_token_ids": np.int32,
    "response_token_ids": np.int32,
    "loss_mask": np.int8,
    "response_logprobs": np.float64,
}


def _list_column(rows: Sequence[Sequence[Any]], dtype: type[np.generic], arrow_type: pa.DataType) -> pa.Array:
    # One flat numpy buffer plus offsets: far cheaper than letting pyarrow walk nested Python lists.
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int32, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter((x for r in rows for x in r), dtype=dtype, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=arrow_type.value_type))


def traces_to_table(traces: Sequence[Trace]) -> pa.Table:
    """Return the traces as an Arrow table with :data:`TRACE_SCHEMA`."""
    columns: dict[str, pa.Array] = {}
    for field in TRACE_SCHEMA:
        values = [getattr(t, field.name) for t in traces]
        if field.name in _NUMERIC_LISTS:
            columns[field.name] = _list_column(values, _NUMERIC_LISTS[field.name], field.type)
        else:
            columns[field.name] = pa.array(values, type=field.type)
    return pa.Table.from_pydict(columns, schema=TRACE_SCHEMA)


def write_parquet(traces: Sequence[Trace], path: Path) -> int:
    """Write traces to a Parquet file atomically (temp file + rename); return the number written."""
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(traces_to_table(traces), tmp, compression="zstd")
    tmp.replace(path)
    return len(traces)


def read_parquet(path: Path) -> list[Trace]:
    """Read traces written by :func:`write_parquet` (extra columns are kept in ``Trace.extra``)."""
    return [Trace.from_dict(row) for row in pq.read_table(path).to_pylist()]


@dataclasses.dataclass(frozen=True, slots=True)
class PaddedBatch:
    """Traces as right-padded ``[batch, length]`` arrays plus per-trace ``[batch]`` arrays."""

    input_ids: npt.NDArray[np.int64]
    attention_mask: npt.NDArray[np.int64]
    loss_mask: npt.NDArray[np.float32]
    old_logprobs: npt.NDArray[np.float32]
    prompt_lengths: npt.NDArray[np.int64]
    rewards: npt.NDArray[np.float32]
    weights: npt.NDArray[np.float32]

    def as_dict(self) -> dict[str, npt.NDArray[Any]]:
        """Return the arrays by field name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def to_padded_arrays(traces: Sequence[Trace], *, pad_token_id: int = 0, max_length: int | None = None) -> PaddedBatch:
    """Pad traces into one batch.

    Args:
        traces: The traces (at least one).
        pad_token_id: Token written at padding positions (masked out by ``attention_mask``).
        max_length: Cut rows longer than this from the right (their tail tokens lose their loss); ``None``
            pads to the longest row.

    Returns:
        The padded batch.

    Raises:
        InvalidArgument: No traces, or ``max_length`` is not positive.
    """
    if not traces:
        raise InvalidArgument("cannot pad an empty list of traces")
    if max_length is not None and max_length <= 0:
        raise InvalidArgument(f"max_length must be positive, got {max_length}")
    full = [len(t.prompt_token_ids) + len(t.response_token_ids) for t in traces]
    width = max(full) if max_length is None else min(max(full), max_length)
    batch = len(traces)
    input_ids = np.full((batch, width), pad_token_id, dtype=np.int64)
    attention = np.zeros((batch, width), dtype=np.int64)
    loss_mask = np.zeros((batch, width), dtype=np.float32)
    old_logprobs = np.zeros((batch, width), dtype=np.float32)
    for row, trace in enumerate(traces):
        p = len(trace.prompt_token_ids)
        n = min(full[row], width)
        input_ids[row, :n] = np.concatenate([trace.prompt_token_ids, trace.response_token_ids])[:n]
        attention[row, :n] = 1
        r = max(n - p, 0)
        if r:
            mask = np.asarray(trace.loss_mask[:r], dtype=np.float32)
            loss_mask[row, p:n] = mask
            # Keep placeholders out of the batch even if a producer wrote non-zero values at mask 0.
            logprobs = np.asarray(trace.response_logprobs[:r], dtype=np.float32)
            old_logprobs[row, p:n] = np.where(mask > 0, logprobs, np.float32(0.0))
    return PaddedBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        old_logprobs=old_logprobs,
        prompt_lengths=np.asarray([len(t.prompt_token_ids) for t in traces], dtype=np.int64),
        rewards=np.asarray([t.reward for t in traces], dtype=np.float32),
        weights=np.asarray([t.weight for t in traces], dtype=np.float32),
    )


def to_padded_tensors(
    traces: Sequence[Trace], *, pad_token_id: int = 0, max_length: int | None = None, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Return :func:`to_padded_arrays` as torch tensors on ``device``.

    Raises:
        FailedPrecondition: torch is not installed.
    """
    try:
        import torch
    except ModuleNotFoundError:
        raise FailedPrecondition("torch is not installed: pip install 'polar-rollout[torch]'") from None
    arrays = to_padded_arrays(traces, pad_token_id=pad_token_id, max_length=max_length).as_dict()
    return {name: torch.from_numpy(a).to(device) for name, a in arrays.items()}
