"""The header-only checkpoint check: every tensor missing, extra, reshaped or of another dtype is named.

Checkpoints are written by hand (``config.json`` and safetensors files of zero tensors), so no torch.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest

from model_proxy.backends.checkpoint import (
    TensorSpec,
    compare_checkpoints,
    compare_config,
    compare_tensors,
    read_checkpoint,
    refusal,
)
from polar_core.errors import FailedPrecondition

CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 64,
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "tie_word_embeddings": False,
}
TENSORS: dict[str, tuple[list[int], str]] = {
    "model.embed_tokens.weight": ([64, 8], "F32"),
    "model.layers.0.mlp.up_proj.weight": ([16, 8], "F32"),
    "model.norm.weight": ([8], "F32"),
    "lm_head.weight": ([64, 8], "F32"),
}
_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1, "I64": 8}


def _safetensors(file: Path, tensors: dict[str, tuple[list[int], str]], *, cut: int = 0) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, dtype) in tensors.items():
        size = math.prod(shape) * _BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset - cut))


def _checkpoint(
    path: Path, config: dict[str, Any] | None = None, tensors: dict[str, tuple[list[int], str]] | None = None
) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(CONFIG | (config or {})))
    _safetensors(path / "model.safetensors", TENSORS if tensors is None else tensors)
    return path


def _problems(tmp_path: Path, **kw: Any) -> list[str]:
    served = read_checkpoint(_checkpoint(tmp_path / "served"))
    return compare_checkpoints(served, read_checkpoint(_checkpoint(tmp_path / "candidate", **kw)))


def test_headers_give_names_shapes_and_dtypes(tmp_path: Path) -> None:
    info = read_checkpoint(_checkpoint(tmp_path / "a"))
    assert info.tensors["model.norm.weight"] == TensorSpec((8,), "F32")
    assert info.shapes["lm_head.weight"] == (64, 8)
    assert _problems(tmp_path) == []


def test_a_tensor_of_the_wrong_shape_is_named(tmp_path: Path) -> None:
    bad = TENSORS | {"model.layers.0.mlp.up_proj.weight": ([17, 8], "F32")}
    assert _problems(tmp_path, tensors=bad) == [
        "tensor model.layers.0.mlp.up_proj.weight has shape [17, 8] (served: [16, 8])"
    ]


def test_missing_and_extra_tensors_are_named(tmp_path: Path) -> None:
    bad = {k: v for k, v in TENSORS.items() if k != "model.norm.weight"} | {"model.extra.bias": ([8], "F32")}
    assert _problems(tmp_path, tensors=bad) == [
        "tensor model.norm.weight is missing",
        "tensor model.extra.bias is not in the served model",
    ]


def test_another_intermediate_size_is_refused_by_config_and_shape(tmp_path: Path) -> None:
    bad = TENSORS | {"model.layers.0.mlp.up_proj.weight": ([32, 8], "F32")}
    assert _problems(tmp_path, config={"intermediate_size": 32}, tensors=bad) == [
        "intermediate_size 32 (served: 16)",
        "tensor model.layers.0.mlp.up_proj.weight has shape [32, 8] (served: [16, 8])",
    ]


def test_a_float_may_stand_for_another_float_but_not_for_an_integer(tmp_path: Path) -> None:
    halves = {k: (shape, "BF16") for k, (shape, _) in TENSORS.items()}
    assert _problems(tmp_path / "bf16", tensors=halves) == []
    bad = TENSORS | {"model.norm.weight": ([8], "I8")}
    assert _problems(tmp_path / "i8", tensors=bad) == ["tensor model.norm.weight has dtype I8 (served: F32)"]
    served = {"scale": TensorSpec((1,), "I64")}
    assert compare_tensors(served, {"scale": TensorSpec((1,), "I32")}) == ["tensor scale has dtype I32 (served: I64)"]


def test_tied_embeddings_make_the_output_layer_optional(tmp_path: Path) -> None:
    untied = {k: v for k, v in TENSORS.items() if k != "lm_head.weight"}
    served = read_checkpoint(_checkpoint(tmp_path / "served", {"tie_word_embeddings": True}, untied))
    both = read_checkpoint(_checkpoint(tmp_path / "both", {"tie_word_embeddings": True}))
    assert compare_checkpoints(served, both) == []
    assert compare_tensors({"a": TensorSpec((1,), "F32")}, {}, aliases={"a"}) == []


def test_keys_either_config_leaves_out_are_not_compared() -> None:
    assert compare_config({"head_dim": 4, "architectures": ["X"]}, {"architectures": []}) == []
    assert compare_config({"vocab_size": 4}, {"vocab_size": 5}) == ["vocab_size 5 (served: 4)"]


def test_a_sharded_checkpoint_is_read_through_its_index(tmp_path: Path) -> None:
    path = tmp_path / "sharded"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(CONFIG))
    names = list(TENSORS)
    first, second = names[:2], names[2:]
    _safetensors(path / "model-00001-of-00002.safetensors", {n: TENSORS[n] for n in first})
    _safetensors(path / "model-00002-of-00002.safetensors", {n: TENSORS[n] for n in second})
    _safetensors(path / "stray.safetensors", {"not.listed": ([1], "F32")})  # not in the index: not read
    weight_map = {n: "model-00001-of-00002.safetensors" for n in first} | {
        n: "model-00002-of-00002.safetensors" for n in second
    }
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    info = read_checkpoint(path)
    assert set(info.tensors) == set(TENSORS)
    served = read_checkpoint(_checkpoint(tmp_path / "served"))
    assert compare_checkpoints(served, info) == []

    (path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": weight_map | {"model.norm.weight": "model-00001-of-00002.safetensors"}})
    )
    with pytest.raises(FailedPrecondition, match=r"places tensors where they are not: model\.norm\.weight"):
        read_checkpoint(path)
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "gone.safetensors"}}))
    with pytest.raises(FailedPrecondition, match=r"shards that are not there: gone\.safetensors"):
        read_checkpoint(path)


def test_a_truncated_file_or_a_bin_only_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cut"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(CONFIG))
    _safetensors(path / "model.safetensors", TENSORS, cut=4)
    with pytest.raises(FailedPrecondition, match="truncated or corrupt"):
        read_checkpoint(path)
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "config.json").write_text(json.dumps(CONFIG))
    (binary / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(FailedPrecondition, match="only safetensors checkpoints can be checked"):
        read_checkpoint(binary)


def test_the_refusal_names_ten_problems_and_counts_the_rest() -> None:
    served = {f"layer.{i:02d}.weight": TensorSpec((2,), "F32") for i in range(13)}
    problems = compare_tensors(served, {})
    error = refusal("/ckpt/v2", "the served model", problems)
    assert error.message.startswith("checkpoint '/ckpt/v2' does not fit the served model: 13 problems: ")
    assert "tensor layer.09.weight is missing; and 3 more" in error.message
    assert "layer.10" not in error.message
    assert refusal("/c", "x", ["one"]).message == "checkpoint '/c' does not fit x: 1 problem: one"
