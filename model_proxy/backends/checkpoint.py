"""Checks of a Hugging Face checkpoint directory against what a backend serves, from headers alone.

Every backend that loads checkpoints validates one here *before* it pauses or loads anything: the directory
exists, its ``config.json`` is readable and states the served model's architecture and sizes, and the tensors
listed in its safetensors headers have exactly the served names, shapes and dtypes. Only the headers are read
(the 8-byte length and the JSON at the start of each ``*.safetensors`` file, and
``model.safetensors.index.json`` for a sharded checkpoint: a few kilobytes), never the tensors, and nothing
here imports torch.

What the served side is depends on the backend: the in-process transformers backend describes its model's
``state_dict`` (:mod:`model_proxy.backends.transformers_backend`); the HTTP backends (vLLM, SGLang), which
cannot see the server's tensors, read the headers of the checkpoint the server was started from or last
loaded. Either way the comparison is :func:`compare_tensors` and the refusal :func:`refusal`.

The rules:

- **names**: every served tensor must be present (a missing one would be initialised at random: transformers
  calls them "newly initialized", vLLM fails half-way through a reload), and no other tensor may be (an extra
  one is a sign of another architecture; transformers drops it silently). An *alias* (the output layer of a
  model with tied embeddings, which shares the input embedding's tensor) may be present or absent.
- **shapes**: equal, tensor by tensor.
- **dtypes**: equal, except that one floating-point type may stand for another (``F16``, ``BF16``, ``F32``,
  ``F64``): both loaders cast a float checkpoint to the served precision, and trainers save in their own.
  Integer, boolean and 8-bit float tensors (quantised weights, their scales) must match exactly.
- **config**: the :data:`ARCHITECTURE_KEYS` that both configs state are equal (a key absent from one side is
  a default not written out, and the tensor shapes check the sizes anyway); a tied checkpoint cannot replace
  an untied model or the reverse.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from polar_core.errors import FailedPrecondition

__all__ = [
    "ARCHITECTURE_KEYS",
    "CheckpointInfo",
    "TensorSpec",
    "compare_checkpoints",
    "compare_config",
    "compare_tensors",
    "read_checkpoint",
    "refusal",
]

ARCHITECTURE_KEYS = (
    "architectures",
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
)
"""``config.json`` fields that must be equal for a checkpoint to replace the served one in place."""

INDEX_FILE = "model.safetensors.index.json"
_MAX_HEADER_BYTES = 100 * 1024 * 1024
_LISTED = 10
_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
}
_FLOATS = frozenset({"F16", "BF16", "F32", "F64"})


@dataclasses.dataclass(frozen=True, slots=True)
class TensorSpec:
    """A tensor as a safetensors header describes it.

    Attributes:
        shape: Its dimensions.
        dtype: The safetensors dtype code (``F32``, ``BF16``, ``I8``...).
    """

    shape: tuple[int, ...]
    dtype: str


class CheckpointInfo:
    """What the checks need of a checkpoint directory: its config and its tensors (from the headers).

    Attributes:
        path: The directory.
        config: ``config.json`` as a mapping.
        tensors: Tensor name to shape and dtype, over every safetensors file of the checkpoint.
    """

    def __init__(self, path: Path, config: Mapping[str, Any], tensors: Mapping[str, TensorSpec]) -> None:
        self.path = path
        self.config = dict(config)
        self.tensors = dict(tensors)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name to shape."""
        return {name: spec.shape for name, spec in self.tensors.items()}

    @property
    def architecture(self) -> str:
        """The first of ``architectures``, else ``model_type``, else empty."""
        names = self.config.get("architectures") or []
        if isinstance(names, list) and names:
            return str(names[0])
        return str(self.config.get("model_type") or "")

    @property
    def tied(self) -> bool:
        """Whether the output layer shares the input embedding (the config says so, or no ``lm_head`` tensor)."""
        value = self.config.get("tie_word_embeddings")
        if value is None:
            return "lm_head.weight" not in self.tensors
        return bool(value)


def _header(file: Path) -> dict[str, TensorSpec]:
    """The tensors one safetensors file declares (8-byte little-endian length, then JSON), checked for sense.

    Raises:
        ValueError: Not a safetensors file, an unknown dtype, or offsets that do not fit the shape or the file.
    """
    size = file.stat().st_size
    with file.open("rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise ValueError("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > _MAX_HEADER_BYTES or 8 + length > size:
            raise ValueError(f"a header of {length} bytes in a file of {size}")
        header = json.loads(handle.read(length))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    tensors: dict[str, TensorSpec] = {}
    data_bytes = size - 8 - length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"tensor {name}: not a JSON object")
        dtype = str(entry["dtype"])
        if dtype not in _DTYPE_BYTES:
            raise ValueError(f"tensor {name}: unknown dtype {dtype!r}")
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(x) for x in entry["data_offsets"])
        if end - begin != math.prod(shape) * _DTYPE_BYTES[dtype] or begin < 0 or end > data_bytes:
            raise ValueError(
                f"tensor {name}: bytes {begin}-{end} do not hold {dtype} {list(shape)} in {data_bytes} data bytes "
                "(a truncated or corrupt file)"
            )
        tensors[str(name)] = TensorSpec(shape, dtype)
    return tensors


def _weight_files(directory: Path) -> tuple[list[Path], dict[str, str]]:
    """The safetensors files to read and, for a sharded checkpoint, its index's tensor → file map."""
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            mapping = {str(k): str(v) for k, v in weight_map.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise FailedPrecondition(f"cannot read {index}: {exc}") from exc
        files = [directory / name for name in sorted(set(mapping.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise FailedPrecondition(f"{index} names shards that are not there: {', '.join(absent)}")
        return files, mapping
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        if any(directory.glob("pytorch_model*.bin")):
            raise FailedPrecondition(
                f"{str(directory)!r} holds only pytorch_model*.bin files: only safetensors checkpoints can be "
                "checked without loading them; save with safetensors (save_pretrained's default)"
            )
        raise FailedPrecondition(f"no weight files (*.safetensors) in {str(directory)!r}")
    return files, {}


def read_checkpoint(path: str | Path) -> CheckpointInfo:
    """Read a checkpoint directory's config and tensor names, shapes and dtypes (headers only).

    A sharded checkpoint is read through ``model.safetensors.index.json``: the files it names, each tensor
    where the index says it is.

    Raises:
        FailedPrecondition: Not a directory, no or unreadable ``config.json``, no safetensors files, an
            unreadable or inconsistent header or index; the message names the path and the problem.
    """
    directory = Path(path)
    if not directory.is_dir():
        raise FailedPrecondition(f"weights path {str(path)!r} is not a directory")
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise FailedPrecondition(f"no config.json in {str(path)!r}")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FailedPrecondition(f"cannot read {config_file}: {exc}") from exc
    if not isinstance(config, dict):
        raise FailedPrecondition(f"{config_file} is not a JSON object")
    files, weight_map = _weight_files(directory)
    per_file: dict[str, dict[str, TensorSpec]] = {}
    tensors: dict[str, TensorSpec] = {}
    for file in files:
        try:
            found = per_file[file.name] = _header(file)
        except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
            raise FailedPrecondition(f"cannot read the safetensors header of {file}: {exc}") from exc
        twice = sorted(set(found) & set(tensors))
        if twice:
            raise FailedPrecondition(f"{file} repeats tensors of another file: {_listed(twice)}")
        tensors.update(found)
    astray = sorted(n for n, f in weight_map.items() if n not in per_file.get(f, {}))
    if astray:
        raise FailedPrecondition(f"{directory / INDEX_FILE} places tensors where they are not: {_listed(astray)}")
    return CheckpointInfo(directory, config, tensors)


def compare_config(served: Mapping[str, Any], candidate: Mapping[str, Any]) -> list[str]:
    """The :data:`ARCHITECTURE_KEYS` on which two configs differ, as phrases (keys either leaves unset are skipped)."""
    problems = []
    for key in ARCHITECTURE_KEYS:
        ours, theirs = served.get(key), candidate.get(key)
        if ours is None or theirs is None or ours == [] or theirs == []:
            continue
        if ours != theirs:
            problems.append(f"{key} {theirs!r} (served: {ours!r})")
    return problems


def _dtypes_fit(served: str, candidate: str) -> bool:
    return served == candidate or (served in _FLOATS and candidate in _FLOATS)


def compare_tensors(
    served: Mapping[str, TensorSpec], candidate: Mapping[str, TensorSpec], *, aliases: Collection[str] = ()
) -> list[str]:
    """Every tensor of ``candidate`` that cannot replace ``served``'s, one phrase each (empty: all fit).

    Args:
        served: What is served, by name.
        candidate: The checkpoint's tensors, by name.
        aliases: Names of tensors that share another one's storage (a tied output layer): ``candidate`` may hold
            them or not.
    """
    optional = set(aliases)
    problems = [f"tensor {n} is missing" for n in sorted(set(served) - set(candidate) - optional)]
    problems += [f"tensor {n} is not in the served model" for n in sorted(set(candidate) - set(served) - optional)]
    for name in sorted(set(served) & set(candidate)):
        ours, theirs = served[name], candidate[name]
        if ours.shape != theirs.shape:
            problems.append(f"tensor {name} has shape {list(theirs.shape)} (served: {list(ours.shape)})")
        if not _dtypes_fit(ours.dtype, theirs.dtype):
            problems.append(f"tensor {name} has dtype {theirs.dtype} (served: {ours.dtype})")
    return problems


def compare_checkpoints(served: CheckpointInfo, candidate: CheckpointInfo) -> list[str]:
    """The reasons ``candidate`` cannot replace ``served`` in place, as phrases (empty: it can)."""
    problems = compare_config(served.config, candidate.config)
    if served.tied != candidate.tied and not any(p.startswith("tie_word_embeddings") for p in problems):
        problems.append(f"tie_word_embeddings {candidate.tied!r} (served: {served.tied!r})")
    aliases = {"lm_head.weight"} if served.tied else set()
    return problems + compare_tensors(served.tensors, candidate.tensors, aliases=aliases)


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:_LISTED])
    return shown if len(items) <= _LISTED else f"{shown} and {len(items) - _LISTED} more"


def refusal(path: str, served: str, problems: list[str]) -> FailedPrecondition:
    """The error refusing checkpoint ``path``: the first ten problems named, then how many more.

    Args:
        path: The checkpoint.
        served: What it was compared with, for the message (e.g. ``the served model``).
        problems: Phrases from the ``compare_*`` functions (not empty).
    """
    count = f"{len(problems)} problem" + ("s" if len(problems) != 1 else "")
    shown = "; ".join(problems[:_LISTED])
    more = f"; and {len(problems) - _LISTED} more" if len(problems) > _LISTED else ""
    return FailedPrecondition(f"checkpoint {path!r} does not fit {served}: {count}: {shown}{more}")
