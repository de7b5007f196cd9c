"""The in-process backend's decoding loop as it was before the prefix cache, kept as the bench's baseline.

One forward pass over the whole prompt that also computes the logits of every prompt position, no reuse of
earlier calls' keys and values, and torch's default thread count.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from model_proxy.backends.transformers_backend import TransformersBackend, sample_next
from model_proxy.models import GenerationRequest

__all__ = ["LegacyBackend"]


class LegacyBackend(TransformersBackend):
    """:class:`TransformersBackend` with the decoding loop of commit 6bd91b0."""

    def __init__(self, model: Any, *, threads: int) -> None:
        super().__init__(model, prefix_cache=0)
        self._legacy_threads = threads

    def _decode_loop(self, request: GenerationRequest, max_tokens: int, emit: Any, stop: threading.Event) -> None:
        from transformers import DynamicCache

        from model_proxy.backends._in_process import SampledToken

        torch.set_num_threads(self._legacy_threads)
        model = self._model
        device = next(model.parameters()).device
        generator = torch.Generator(device=device)
        if request.sampling.seed is None:
            generator.seed()
        else:
            generator.manual_seed(request.sampling.seed)
        stops = frozenset(request.stop_token_ids)
        with torch.inference_mode():
            inputs = torch.tensor([list(request.prompt_token_ids)], dtype=torch.long, device=device)
            cache = DynamicCache(config=model.config)
            for step in range(max_tokens):
                if stop.is_set():
                    return
                out = model(input_ids=inputs, use_cache=True, **{self._cache_arg: cache})
                token, logprob = sample_next(out.logits[0, -1], request.sampling, generator)
                finish: str | None = None
                if token in stops:
                    finish = "stop"
                elif step == max_tokens - 1:
                    finish = "length"
                emit(SampledToken(token, logprob, finish))
                if finish is not None:
                    return
                inputs = torch.tensor([[token]], dtype=torch.long, device=device)
