"""The policy model the proxy serves: its tokenizer (always) and, for the in-process backend, its weights."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from model_proxy.backends.factory import create_backend
from model_proxy.ports import Backend
from polar_core.errors import InvalidArgument

__all__ = ["PolicyModel", "load_policy", "make_backend"]


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyModel:
    """A loaded policy: ``weights`` is None unless an in-process backend needs them."""

    name: str
    tokenizer: Any
    weights: Any | None = None


def load_policy(model: str, *, with_weights: bool) -> PolicyModel:
    """Load ``smollm2``, ``tiny`` or a Hugging Face directory; weights only when ``with_weights``."""
    # Imported lazily: torch and transformers take seconds to import and gRPC-only users never need them.
    from polar_core import default_model, model_fixtures

    tokenizer: Any
    weights: Any = None
    if model == "tiny":
        tokenizer = model_fixtures.build_tiny_tokenizer()
        weights = model_fixtures.build_tiny_model(tokenizer) if with_weights else None
        return PolicyModel(model, tokenizer, weights)
    if model == "smollm2":
        if with_weights:
            tokenizer, weights = default_model.load_smollm2()
            return PolicyModel(model, tokenizer, weights)
        from transformers import AutoTokenizer

        path = default_model.smollm2_gguf_path()
        return PolicyModel(model, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name))
    directory = Path(model)
    if not directory.is_dir():
        raise InvalidArgument(f"model {model!r} is neither 'smollm2', 'tiny' nor a model directory")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    if with_weights:
        weights = AutoModelForCausalLM.from_pretrained(directory)
        weights.eval()
    return PolicyModel(model, tokenizer, weights)


def make_backend(name: str, options: Mapping[str, Any], policy: PolicyModel) -> Backend:
    """Create the backend; the in-process one samples from the already-loaded policy weights.

    Raises:
        InvalidArgument: See :func:`~model_proxy.backends.factory.create_backend`.
    """
    return create_backend(name, options, policy.tokenizer, weights=policy.weights)
