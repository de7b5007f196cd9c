"""Pre-flight checks of a Hugging Face checkpoint directory against the one a server serves, on the proxy host.

A server-side reload that fails can be fatal (vLLM's CPU build moves every layer to the meta device before
it reads the checkpoint, so any failure leaves a broken engine that dies on its next forward pass), so the
HTTP backends validate a checkpoint here *before* anything is sent: the directory exists, its
``config.json`` is readable and names the served model's architecture and shapes, and the tensor names
and shapes in its ``*.safetensors`` headers equal the served checkpoint's. Only the headers are read (a few
kilobytes), never the tensors, and nothing imports torch.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polar_core.errors import FailedPrecondition

__all__ = ["ARCHITECTURE_KEYS", "CheckpointInfo", "compare_checkpoints", "read_checkpoint"]

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

_MAX_HEADER_BYTES = 100 * 1024 * 1024
_LISTED = 5


class CheckpointInfo:
    """What the checks need of a checkpoint directory: its config and its tensors' shapes.

    Attributes:
        path: The directory.
        config: ``config.json`` as a mapping.
        shapes: Tensor name to shape, from every ``*.safetensors`` header.
    """

    def __init__(self, path: Path, config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.path = path
        self.config = dict(config)
        self.shapes = dict(shapes)

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
            return "lm_head.weight" not in self.shapes
        return bool(value)


def _header_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes from one safetensors file's header (8-byte little-endian length, then JSON)."""
    with file.open("rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise ValueError("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > _MAX_HEADER_BYTES:
            raise ValueError(f"header of {length} bytes")
        header = json.loads(handle.read(length))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return {
        str(name): tuple(int(d) for d in entry["shape"])
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict)
    }


def read_checkpoint(path: str | Path) -> CheckpointInfo:
    """Read a checkpoint directory's config and tensor shapes (headers only).

    Raises:
        FailedPrecondition: Not a directory, no or unreadable ``config.json``, no ``*.safetensors``, or an
            unreadable safetensors header; the message names the path and the problem.
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
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FailedPrecondition(f"no weight files (*.safetensors) in {str(path)!r}")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            shapes.update(_header_shapes(file))
        except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
            raise FailedPrecondition(f"cannot read the safetensors header of {file}: {exc}") from exc
    return CheckpointInfo(directory, config, shapes)


def compare_checkpoints(served: CheckpointInfo, candidate: CheckpointInfo) -> list[str]:
    """The reasons ``candidate`` cannot replace ``served`` in place, as phrases (empty: it can).

    Compares the :data:`ARCHITECTURE_KEYS` of both configs and the names and shapes of all tensors.
    """
    problems = [
        f"{key} {candidate.config.get(key)!r} (served: {served.config.get(key)!r})"
        for key in ARCHITECTURE_KEYS
        if served.config.get(key) != candidate.config.get(key)
    ]
    missing = sorted(set(served.shapes) - set(candidate.shapes))
    extra = sorted(set(candidate.shapes) - set(served.shapes))
    reshaped = sorted(n for n in set(served.shapes) & set(candidate.shapes) if served.shapes[n] != candidate.shapes[n])
    if missing:
        problems.append(f"{len(missing)} tensors missing ({', '.join(missing[:_LISTED])})")
    if extra:
        problems.append(f"{len(extra)} unknown tensors ({', '.join(extra[:_LISTED])})")
    for name in reshaped[:_LISTED]:
        problems.append(f"tensor {name} has shape {list(candidate.shapes[name])} (served: {list(served.shapes[name])})")
    if len(reshaped) > _LISTED:
        problems.append(f"{len(reshaped) - _LISTED} more tensors of another shape")
    return problems
