"""Checkpoints: the initial one (``v0``) and one per policy version, in the Hugging Face layout."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["checkpoint_dir", "initial_checkpoint", "load_policy_model", "save_checkpoint"]


def checkpoint_dir(run_dir: Path, version: int) -> Path:
    """``run_dir/checkpoints/v{version}``."""
    return run_dir / "checkpoints" / f"v{version}"


def initial_checkpoint(model: str, run_dir: Path, *, seed: int = 0) -> Path:
    """The directory the run starts from: ``model`` itself when it is a directory, else ``tiny`` or
    ``smollm2`` saved to ``run_dir/checkpoints/v0`` (the proxy needs a directory to load)."""
    if model not in ("tiny", "smollm2"):
        return Path(model).resolve()
    target = checkpoint_dir(run_dir, 0).resolve()
    if (target / "config.json").exists():
        return target
    if model == "tiny":
        from polar_core.model_fixtures import save_tiny_model

        return save_tiny_model(target, seed=seed)
    from polar_core.default_model import load_smollm2

    tokenizer, weights = load_smollm2()
    save_checkpoint(_dequantized(weights), tokenizer, target)
    return target


def _dequantized(model: Any) -> Any:
    """A plain copy of a model loaded from a GGUF file (its weights are already float32, but transformers
    refuses to ``save_pretrained`` a model that remembers its quantizer)."""
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    auto: Any = AutoModelForCausalLM
    plain = auto.from_config(config)
    plain.load_state_dict(model.state_dict())
    plain.train(False)
    return plain


def save_checkpoint(model: Any, tokenizer: Any, directory: Path) -> Path:
    """Write ``model`` and ``tokenizer`` with ``save_pretrained`` to ``directory``, atomically.

    The files go to a temporary sibling first and the directory is renamed into place, so a backend that
    reads ``directory`` never sees a half-written checkpoint.
    """
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the backends reading it may run as another user
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def load_policy_model(directory: Path) -> tuple[Any, Any]:
    """Load the tokenizer and the float32 model the trainer optimises from a checkpoint directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.train(False)
    return tokenizer, model
