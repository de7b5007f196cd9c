"""An in-process Hugging Face causal LM as a backend (CPU or GPU), for small models and tests.

Decoding runs in a worker thread with the model's KV cache, one generation at a time per model, and hands
tokens to the event loop as they are sampled. Prompts are prefilled in blocks aligned on absolute positions,
and the KV caches of recent calls are reused for the whole blocks a new prompt shares with them, which skips
work without changing any result (:mod:`model_proxy.backends._prefix_cache`; figures in docs/backends.md).

Log-probabilities: each sampled token is reported with ``log_softmax(logits / temperature)`` over the whole
vocabulary (``log_softmax(logits)`` at temperature 0, which decodes greedily). When ``top_k`` or ``top_p``
truncate the distribution the token is *sampled* from the truncated, renormalised distribution, but the
reported value is still the untruncated one, so it matches what a trainer computes from the same logits
(and vLLM's default). Trainers that want the exact sampling probability must not truncate.

``quantize`` (``"float16"`` or ``"int8"``, CPU only) serves the Linear layers in fewer bytes, applied again
to every checkpoint :meth:`TransformersBackend.load_weights` loads; the recorded log-probabilities are still
those of the forward pass that sampled, i.e. of the served, quantised model
(:mod:`model_proxy.backends.transformers_quantize`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import re
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import torch

from model_proxy.backends._in_process import Item, SampledToken, check_request, chunks
from model_proxy.backends._prefix_cache import CacheEntry, PrefixCache, new_cache
from model_proxy.backends.checkpoint import TensorSpec, compare_config, compare_tensors, read_checkpoint, refusal
from model_proxy.backends.transformers_quantize import QUANTIZE_KINDS, Quantize, quantize_model
from model_proxy.errors import BackendUnavailable
from model_proxy.models import GenerationChunk, GenerationRequest, SamplingParams
from polar_core.errors import FailedPrecondition, Internal, InvalidArgument

__all__ = ["TransformersBackend", "sample_next", "served_tensors"]

_LOAD_ERRORS = (OSError, ValueError, RuntimeError, KeyError)
_PREFIX_CACHE_ENTRIES = 4
_PREFILL_BLOCK = 128
_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def served_tensors(model: Any) -> tuple[dict[str, TensorSpec], frozenset[str]]:
    """What a checkpoint of ``model`` holds: its ``state_dict``'s names, shapes and dtypes, and its aliases.

    A tensor reachable under two names (tied input and output embeddings) is saved once, under its first
    name; the later names are returned as aliases, which a checkpoint may hold or leave out, as are the names
    the model class itself leaves out of what it saves (``_keys_to_ignore_on_save``). Nothing is copied.
    """
    tensors: dict[str, TensorSpec] = {}
    aliases: set[str] = set()
    seen: set[int] = set()
    unsaved = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_save", None) or []]
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            aliases.add(name)
            continue
        seen.add(id(tensor))
        if any(p.search(name) for p in unsaved):
            aliases.add(name)  # optional, but compared when present
        dtype = _SAFETENSORS_DTYPES.get(tensor.dtype, str(tensor.dtype).removeprefix("torch."))
        tensors[name] = TensorSpec(tuple(int(d) for d in tensor.shape), dtype)
    return tensors, frozenset(aliases)


def sample_next(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    """Sample one token from a row of logits and return it with its raw log-probability.

    Args:
        logits: Logits of the next position, shape ``(vocab,)``.
        sampling: Temperature, ``top_k`` (-1 or 0: off) and ``top_p`` (1.0: off).
        generator: The request's random generator.

    Returns:
        The token ID and ``log_softmax(logits / T)`` at it (untruncated; T = 1 when greedy).
    """
    temperature = sampling.temperature
    scaled = logits.float() if temperature == 0.0 else logits.float() / temperature
    log_probs = torch.log_softmax(scaled, dim=-1)
    if temperature == 0.0:
        token = int(torch.argmax(log_probs).item())
        return token, float(log_probs[token].item())
    probs = log_probs.exp()
    if 0 < sampling.top_k < probs.shape[-1]:
        kth = torch.topk(probs, sampling.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1) / sorted_probs.sum()
        # Keep the smallest prefix whose mass reaches top_p: a token is dropped when the mass before it
        # already does.
        drop_sorted = (cumulative - sorted_probs / sorted_probs.sum()) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        probs = torch.where(drop, torch.zeros_like(probs), probs)
    token = int(torch.multinomial(probs, 1, generator=generator).item())
    return token, float(log_probs[token].item())


class TransformersBackend:
    """Samples from a transformers causal LM in this process.

    Attributes:
        name: ``"transformers"``.
    """

    name = "transformers"

    def __init__(
        self,
        model: Any,
        *,
        device: str | None = None,
        dtype: str | None = None,
        max_context: int | None = None,
        chunk_size: int = 4,
        prefix_cache: int = _PREFIX_CACHE_ENTRIES,
        prefill_block: int = _PREFILL_BLOCK,
        threads: int | None = None,
        quantize: Quantize = "none",
    ) -> None:
        """Create the backend.

        Args:
            model: A loaded ``PreTrainedModel``, or a model directory loaded by :meth:`start`.
            device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``...; default: the loaded model's device, else CPU.
            dtype: torch dtype name used when loading from a directory (e.g. ``"bfloat16"``); default float32.
            max_context: Context length; default the config's ``max_position_embeddings``.
            chunk_size: Most tokens per streamed chunk (fewer when decoding is slower than the consumer).
            prefix_cache: How many recent calls' KV caches to keep for reuse by a call sharing their prefix
                (0: none; see :mod:`model_proxy.backends._prefix_cache`).
            prefill_block: Prompt positions per prefill forward pass; a reused prefix is a multiple of it.
            threads: torch intra-op threads to decode with (process-wide). Default on CPU: one fewer than the
                cores this process may use (at least 1), leaving a core to the event loop, the other services
                and the agent; OpenMP threads wait for each other at every operation, so one preempted thread
                stalls them all (on 2 busy cores, 2 threads were several times slower than 1). On GPU: untouched.
            quantize: ``"none"``, or ``"float16"`` / ``"int8"`` Linear layers on CPU
                (:mod:`model_proxy.backends.transformers_quantize`), for the model given and every checkpoint
                loaded later. A model given here is copied first, so the caller's stays float32.

        Raises:
            InvalidArgument: An unknown ``quantize`` kind.
        """
        if quantize not in QUANTIZE_KINDS:
            raise InvalidArgument(
                f"transformers backend: quantize must be one of {list(QUANTIZE_KINDS)}, not {quantize!r}"
            )
        self._quantize: Quantize = quantize
        self._source = model
        self._model: Any = None if isinstance(model, str | Path) else model
        self._device = device
        self._dtype = dtype
        self._max_context = max_context
        self._chunk_size = max(1, chunk_size)
        self._lock = asyncio.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._cache_arg = "cache"
        self._last_logits: dict[str, int] = {}
        self._prefix = PrefixCache(prefix_cache, prefill_block)
        self._threads = threads
        self._quantized = False  # whether self._model already is the quantised one
        # The served model's tensors and config before any quantisation: what a checkpoint must hold.
        self._expected: tuple[dict[str, TensorSpec], frozenset[str]] | None = None
        self._expected_config: dict[str, Any] = {}

    async def start(self) -> None:
        """Load the model (when given a directory) and start the worker thread; idempotent."""
        if self._executor is not None:
            return
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="transformers")
        try:
            if self._model is None:
                self._model = await asyncio.get_running_loop().run_in_executor(executor, self._load)
            elif self._device is not None:
                self._model = self._model.to(self._device)
            if self._expected is None:
                self._expected = served_tensors(self._model)
                self._expected_config = self._model.config.to_dict()
            if self._quantize != "none" and not self._quantized:
                # A loaded model is the caller's (the proxy's policy weights): quantise a copy of it.
                model, kind = self._model, self._quantize
                self._model = await asyncio.get_running_loop().run_in_executor(
                    executor, lambda: quantize_model(model, kind, inplace=self._source is not model)
                )
                self._quantized = True
        except InvalidArgument:
            executor.shutdown(wait=False)
            raise
        except (OSError, ValueError) as exc:
            executor.shutdown(wait=False)
            raise BackendUnavailable(f"transformers backend: cannot load {self._source}: {exc}") from exc
        self._model.eval()
        if self._threads is None and next(self._model.parameters()).device.type == "cpu":
            self._threads = max(1, len(os.sched_getaffinity(0)) - 1)  # cores this process may run on
        params = inspect.signature(self._model.forward).parameters
        # transformers 5.x renamed ``past_key_values`` to ``cache``; accept either.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        # Only the last position's logits are read; without this the prefill also ran the LM head over every
        # prompt position (1,582 x 49,152 logits for SmolLM2's first call, a fifth of its FLOPs).
        self._last_logits = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._executor = executor

    def _load(self) -> Any:
        from transformers import AutoModelForCausalLM

        dtype = getattr(torch, self._dtype) if self._dtype else torch.float32
        loader: Any = AutoModelForCausalLM
        model = loader.from_pretrained(str(self._source), dtype=dtype)
        return model.to(self._device or "cpu")

    async def close(self) -> None:
        """Stop the worker thread; idempotent. The model stays loaded for a later :meth:`start`."""
        async with self._lock:  # lets a generation in flight finish first
            if self._executor is not None:
                executor, self._executor = self._executor, None
                executor.shutdown(wait=True)

    async def check_weights(self, path: str) -> str:
        """Check a checkpoint directory against the served model without loading it; return its architecture.

        Reads ``config.json`` and the safetensors headers only (:mod:`model_proxy.backends.checkpoint`) and
        compares them with the served model's config and ``state_dict`` as it was before any quantisation.

        Raises:
            FailedPrecondition: No directory, no ``config.json`` or safetensors files, an unreadable config or
                header, another architecture or size, or tensors missing, not in the served model, of another
                shape or of an incompatible dtype (each one named, the first ten in the message).
        """
        if self._model is None or self._expected is None:
            raise FailedPrecondition("transformers backend is not started")
        tensors, aliases = self._expected
        candidate = await asyncio.to_thread(read_checkpoint, path)
        from transformers import AutoConfig

        try:
            config = await asyncio.to_thread(AutoConfig.from_pretrained, str(candidate.path))
        except _LOAD_ERRORS as exc:
            raise FailedPrecondition(f"cannot read the config in {path!r}: {exc}") from exc
        problems = compare_config(self._expected_config, config.to_dict())
        problems += compare_tensors(tensors, candidate.tensors, aliases=aliases)
        if problems:
            raise refusal(path, "the served model", problems)
        architectures = list(getattr(config, "architectures", None) or [])
        return str(architectures[0]) if architectures else str(config.model_type)

    async def load_weights(self, path: str) -> None:
        """Load the checkpoint into a new model object (same dtype and device), check it, then swap it in.

        The served model is untouched until the new one is loaded and matches (a load that fails leaves it
        serving); the swap waits for a generation in flight (there is none while the proxy is paused).

        Raises:
            FailedPrecondition: As :meth:`check_weights`, or loading failed.
        """
        await self.check_weights(path)
        assert self._expected is not None
        tensors, aliases = self._expected
        current = next(self._model.parameters())

        def load() -> Any:
            from transformers import AutoModelForCausalLM

            loader: Any = AutoModelForCausalLM
            model = loader.from_pretrained(path, dtype=current.dtype)
            # The loaded model itself, before quantising: a loader that dropped or added a tensor is refused too.
            loaded, _ = served_tensors(model)
            problems = compare_tensors(tensors, loaded, aliases=aliases)
            if problems:
                raise refusal(path, "the served model once loaded", problems)
            # The served kind again: a new checkpoint is float32 until quantised (its own object, so in place).
            return quantize_model(model.to(current.device).eval(), self._quantize, inplace=True)

        try:
            model = await asyncio.to_thread(load)
        except _LOAD_ERRORS as exc:
            raise FailedPrecondition(f"cannot load {path!r}: {exc}") from exc
        async with self._lock:
            self._model = model
            self._source = path
            self._prefix.clear()  # keys and values of the old weights

    async def healthy(self) -> bool:
        """Whether the model is loaded."""
        return self._executor is not None

    @property
    def context_length(self) -> int:
        """The model's context length (tokens)."""
        if self._max_context is not None:
            return self._max_context
        return int(getattr(self._model.config, "max_position_embeddings", 1 << 31))

    def _check(self, request: GenerationRequest) -> int:
        return check_request(request, int(self._model.config.vocab_size), self.context_length)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Sample a response, streaming chunks as tokens are decoded when ``request.stream``.

        Raises:
            BackendUnavailable: :meth:`start` has not run.
            ContextLengthExceeded: The prompt fills the context.
            MalformedRequest: Empty prompt, IDs outside the vocabulary, or ``max_tokens`` below 1.
        """
        if self._executor is None:
            raise BackendUnavailable("transformers backend is not started")
        max_tokens = self._check(request)
        async with self._lock:
            executor = self._executor
            if executor is None:
                raise BackendUnavailable("transformers backend was closed")
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue[Item] = asyncio.Queue()
            stop = threading.Event()

            def emit(item: Item) -> None:
                loop.call_soon_threadsafe(queue.put_nowait, item)

            future = loop.run_in_executor(executor, self._decode, request, max_tokens, emit, stop)
            try:
                async for chunk in chunks(queue, stream=request.stream, chunk_size=self._chunk_size):
                    yield chunk
            finally:
                # Stop decoding when the caller goes away, and wait so the next call gets a free model.
                stop.set()
                await future

    def _decode(
        self,
        request: GenerationRequest,
        max_tokens: int,
        emit: Any,
        stop: threading.Event,
    ) -> None:
        try:
            self._decode_loop(request, max_tokens, emit, stop)
        except Exception as exc:  # reported to the caller through the queue, never lost in the thread
            emit(Internal(f"transformers backend failed while decoding: {exc!r}"))

    def _decode_loop(self, request: GenerationRequest, max_tokens: int, emit: Any, stop: threading.Event) -> None:
        if self._threads is not None and torch.get_num_threads() != self._threads:
            torch.set_num_threads(self._threads)
        model = self._model
        device = next(model.parameters()).device
        generator = torch.Generator(device=device)
        if request.sampling.seed is None:
            generator.seed()
        else:
            generator.manual_seed(request.sampling.seed)
        stops = frozenset(request.stop_token_ids)
        prompt = list(request.prompt_token_ids)
        entry = self._prefix.take(prompt) or CacheEntry(new_cache(model.config), [])
        block = self._prefix.block
        with torch.inference_mode():
            # The prompt's rest in blocks aligned on absolute positions (see _prefix_cache): the same forward
            # passes as on an empty cache, so reuse never changes a result.
            for start in range(len(entry.token_ids), len(prompt), block):
                pending = prompt[start : start + block]
                inputs = torch.tensor([pending], dtype=torch.long, device=device)
                out = self._forward(model, inputs, entry)
                if len(pending) == block:
                    entry.aligned = start + block
            token = -1
            for step in range(max_tokens):
                if stop.is_set():
                    break
                if step:
                    out = self._forward(model, torch.tensor([[token]], dtype=torch.long, device=device), entry)
                token, logprob = sample_next(out.logits[0, -1], request.sampling, generator)
                finish: str | None = None
                if token in stops:
                    finish = "stop"
                elif step == max_tokens - 1:
                    finish = "length"
                emit(SampledToken(token, logprob, finish))
                if finish is not None:
                    break
        # Only here, after no forward pass failed: the entry's IDs are exactly what its cache holds.
        self._prefix.put(entry)

    def _forward(self, model: Any, inputs: torch.Tensor, entry: CacheEntry) -> Any:
        out = model(input_ids=inputs, use_cache=True, **{self._cache_arg: entry.cache}, **self._last_logits)
        entry.token_ids.extend(inputs[0].tolist())
        return out
