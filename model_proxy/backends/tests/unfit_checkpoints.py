"""Checkpoints that must be refused, derived from a good one (shared by the unit and integration tests).

Each keeps the good checkpoint's ``config.json`` byte for byte unless the case is about the config, so only the
tensor check can catch it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

__all__ = ["UNFIT_CASES", "write_unfit_checkpoints"]

_RESHAPED = "model.layers.0.mlp.down_proj.weight"
_DROPPED = "model.layers.1.post_attention_layernorm.weight"
_ADDED = "model.layers.0.mlp.gate_bias"
_RETYPED = "model.norm.weight"

UNFIT_CASES: dict[str, list[str]] = {
    "reshaped": [rf"tensor {_RESHAPED} has shape \[\d+, \d+\] \(served: \[\d+, \d+\]\)"],
    "absent": [rf"tensor {_DROPPED} is missing"],
    "extra": [rf"tensor {_ADDED} is not in the served model"],
    "wider": [r"intermediate_size \d+ \(served: \d+\)", r"tensor model\.layers\.0\.mlp\.up_proj\.weight has shape"],
    "int8": [rf"tensor {_RETYPED} has dtype I8 \(served: (F32|BF16|F16)\)"],
}
"""Case name → regular expressions its refusal must match (each names the tensor or config key)."""


def _derive(good: Path, out: Path, tensors: dict[str, torch.Tensor], config: dict[str, object] | None = None) -> Path:
    out.mkdir(parents=True)
    for item in good.iterdir():
        if item.name != "model.safetensors" and item.is_file():
            shutil.copy2(item, out / item.name)
    if config is not None:
        (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def write_unfit_checkpoints(good: Path, root: Path) -> dict[str, Path]:
    """Write one checkpoint per :data:`UNFIT_CASES` entry under ``root``, from the single-file checkpoint ``good``.

    ``wider`` has another ``intermediate_size`` (config and every MLP tensor, consistently); the others keep
    ``good``'s config.
    """
    base = load_file(str(good / "model.safetensors"))
    out: dict[str, Path] = {}
    reshaped = dict(base)
    rows, cols = reshaped[_RESHAPED].shape
    reshaped[_RESHAPED] = torch.zeros(rows + 1, cols, dtype=reshaped[_RESHAPED].dtype)
    out["reshaped"] = _derive(good, root / "reshaped", reshaped)
    out["absent"] = _derive(good, root / "absent", {k: v for k, v in base.items() if k != _DROPPED})
    out["extra"] = _derive(good, root / "extra", base | {_ADDED: torch.zeros(4)})
    config = json.loads((good / "config.json").read_text())
    wider_size = int(config["intermediate_size"]) * 2
    wider = dict(base)
    for name, tensor in base.items():
        if ".mlp.gate_proj." in name or ".mlp.up_proj." in name:
            wider[name] = torch.zeros(wider_size, tensor.shape[1], dtype=tensor.dtype)
        elif ".mlp.down_proj." in name:
            wider[name] = torch.zeros(tensor.shape[0], wider_size, dtype=tensor.dtype)
    out["wider"] = _derive(good, root / "wider", wider, config | {"intermediate_size": wider_size})
    out["int8"] = _derive(good, root / "int8", base | {_RETYPED: base[_RETYPED].to(torch.int8)})
    return out
