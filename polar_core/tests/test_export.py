from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from polar_core.errors import InvalidArgument
from polar_core.export import read_parquet, to_padded_arrays, to_padded_tensors, write_parquet
from polar_core.records import Trace


def traces() -> list[Trace]:
    return [
        Trace(
            session_id="s",
            task_id="t",
            trace_index=0,
            call_ids=["a", "b"],
            prompt_token_ids=[1, 2],
            response_token_ids=[3, 4, 5],
            loss_mask=[1, 0, 1],
            response_logprobs=[-0.5, 0.0, -0.25],
            reward=1.0,
            weight=0.5,
            status="resolved",
            policy_versions=["v1", "v2"],
        ),
        Trace(
            session_id="s2",
            task_id="t",
            trace_index=0,
            call_ids=["c"],
            prompt_token_ids=[7],
            response_token_ids=[8],
            loss_mask=[1],
            response_logprobs=[-1.0],
            exact_context=False,
        ),
    ]


def test_parquet_round_trip_keeps_every_field(tmp_path: Path):
    path = tmp_path / "traces.parquet"
    assert write_parquet(traces(), path) == 2
    assert [t.to_dict() for t in read_parquet(path)] == [t.to_dict() for t in traces()]


def test_padded_arrays_align_mask_and_logprobs_with_tokens():
    batch = to_padded_arrays(traces(), pad_token_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5], [7, 8, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 0, 1], [0, 1, 0, 0, 0]]
    assert batch.old_logprobs.tolist() == [[0, 0, -0.5, 0, -0.25], [0, -1.0, 0, 0, 0]]
    assert batch.prompt_lengths.tolist() == [2, 1]
    assert batch.weights.tolist() == [0.5, 1.0]


def test_max_length_cuts_rows_from_the_right():
    batch = to_padded_arrays(traces(), max_length=3)
    assert batch.input_ids.tolist() == [[1, 2, 3], [7, 8, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 1], [0, 1, 0]]
    with pytest.raises(InvalidArgument):
        to_padded_arrays([])


def test_tensors_match_arrays():
    tensors = to_padded_tensors(traces())
    arrays = to_padded_arrays(traces()).as_dict()
    assert set(tensors) == set(arrays)
    for name, tensor in tensors.items():
        assert isinstance(tensor, torch.Tensor)
        np.testing.assert_array_equal(tensor.numpy(), arrays[name])
