"""llama.cpp in process as a backend: the wheel's Q4_1 GGUF of SmolLM2 (or any GGUF), on CPU, batched.

One llama.cpp context holds ``slots`` sequences (``n_seq_max``) in a KV cache of ``slots * max_context``
cells. llama.cpp is not thread-safe, so one worker thread owns the model, the context and the batch; the async
:meth:`LlamaCppBackend.generate` hands it a job and receives tokens through an asyncio queue.

Continuous batching: each worker step builds one ``llama_batch`` holding, for every active call, its single
next decode token or (after those) the next piece of its prompt, with the call's slot as sequence id; one
``llama_decode`` runs it and every call whose logits were requested samples its next token. A new call takes
the free slot whose cached tokens share the longest prefix with its prompt (those keys and values are kept;
the prompt's last token is always run again for its logits), else the least recently used free slot; when
every slot is busy it waits, first come first served. A call that goes away (its generator closed, its task
cancelled) is dropped at the next step; its slot keeps the keys and values of the tokens actually decoded.

Sampling and log-probabilities are those of :func:`~model_proxy.backends.transformers_backend.sample_next`,
in numpy over the float32 logits llama.cpp returns: each token is reported with ``log_softmax(logits / T)``
over the whole vocabulary (``log_softmax(logits)`` at temperature 0, which decodes greedily), untruncated by
``top_k``/``top_p``, exact for the served (quantised) model. Batching changes nothing but float rounding.

:meth:`LlamaCppBackend.load_weights` re-exports a Hugging Face checkpoint to GGUF next to the served one
(:mod:`model_proxy.backends._gguf_export`) and swaps the new model in between steps.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import os
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np

from model_proxy.backends._gguf_export import GgufTemplate, export_checkpoint, read_template
from model_proxy.backends._in_process import Item, SampledToken, check_request, chunks
from model_proxy.backends._llama_cpp_lib import load_llama_cpp
from model_proxy.backends._spare_cores import SpareCores
from model_proxy.backends.checkpoint import CheckpointInfo
from model_proxy.errors import BackendUnavailable
from model_proxy.models import GenerationChunk, GenerationRequest, SamplingParams
from polar_core.errors import FailedPrecondition, Internal, InvalidArgument

__all__ = ["LlamaCppBackend", "sample_logits"]

# A step with this many prompt tokens looks at the cores first (a look costs 40 ms); other steps reuse a look up
# to _SPARE_LOOK_EVERY_S old (at most 8% of decoding spent looking).
_SPARE_MIN_PROMPT_TOKENS = 64
_SPARE_LOOK_EVERY_S = 0.5


def sample_logits(
    logits: np.ndarray[Any, Any], sampling: SamplingParams, rng: np.random.Generator
) -> tuple[int, float]:
    """Sample one token from a row of logits and return it with its raw log-probability.

    The numpy twin of :func:`~model_proxy.backends.transformers_backend.sample_next` (same truncation rules).

    Args:
        logits: Logits of the next position, shape ``(vocab,)``.
        sampling: Temperature, ``top_k`` (-1 or 0: off) and ``top_p`` (1.0: off).
        rng: The request's random generator.

    Returns:
        The token ID and ``log_softmax(logits / T)`` at it (untruncated; T = 1 when greedy).
    """
    temperature = sampling.temperature
    scaled = logits.astype(np.float64)
    if temperature != 0.0:
        scaled /= temperature
    shifted = scaled - scaled.max()
    log_probs = shifted - np.log(np.exp(shifted).sum())
    if temperature == 0.0:
        token = int(np.argmax(log_probs))
        return token, float(log_probs[token])
    probs = np.exp(log_probs)
    vocab = probs.shape[0]
    if 0 < sampling.top_k < vocab:
        kth = np.partition(probs, vocab - sampling.top_k)[vocab - sampling.top_k]
        probs = np.where(probs >= kth, probs, 0.0)
    if sampling.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        sorted_probs = probs[order]
        total = sorted_probs.sum()
        # Keep the smallest prefix whose mass reaches top_p: a token is dropped when the mass before it does.
        drop_sorted = (np.cumsum(sorted_probs) / total - sorted_probs / total) >= sampling.top_p
        drop = np.zeros(vocab, dtype=bool)
        drop[order] = drop_sorted
        probs = np.where(drop, 0.0, probs)
    cumulative = np.cumsum(probs)
    # side="right": the first token whose cumulative mass exceeds the draw, never one of probability 0.
    token = min(int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right")), vocab - 1)
    return token, float(log_probs[token])


def _shared_prefix(cached: list[int], prompt: list[int], limit: int) -> int:
    """How many leading tokens ``cached`` and ``prompt`` share, at most ``limit``."""
    n, stop = 0, min(limit, len(cached))
    while n < stop and cached[n] == prompt[n]:
        n += 1
    return n


@dataclasses.dataclass(eq=False, slots=True)
class _Job:
    """One call as the worker sees it."""

    request: GenerationRequest
    max_tokens: int
    emit: Callable[[Item], None]
    rng: np.random.Generator
    stops: frozenset[int]
    aborted: bool = False  # set from the event loop; read by the worker at its next step
    slot: int = -1
    pending: list[int] = dataclasses.field(default_factory=list)  # tokens to run next, from position ``pos``
    pos: int = 0
    produced: int = 0


@dataclasses.dataclass(eq=False, slots=True)
class _Slot:
    """One llama.cpp sequence: the tokens whose keys and values it holds, in order."""

    seq_id: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    last_used: int = 0
    job: _Job | None = None


@dataclasses.dataclass(eq=False, slots=True)
class _Loaded:
    """What the worker owns: the model, its context and the batch buffer (freed together)."""

    model: Any
    ctx: Any
    batch: Any
    vocab: int
    gguf: Path
    threads: int = 0  # the context's threads, set by _pick_threads (0: as created)


class LlamaCppBackend:
    """Samples from a GGUF model with llama.cpp in this process, several calls batched together.

    Attributes:
        name: ``"llama_cpp"``.
    """

    name = "llama_cpp"

    def __init__(
        self,
        gguf: str | Path,
        *,
        threads: int | None = None,
        slots: int = 4,
        max_context: int = 8192,
        n_batch: int = 512,
        chunk_size: int = 4,
        spare: SpareCores | None = None,
    ) -> None:
        """Create the backend (nothing is loaded before :meth:`start`).

        Args:
            gguf: The GGUF file to serve.
            threads: llama.cpp threads (decode and prefill); default one less than the cores this process may
                use (at least 1). llama.cpp's threads spin-wait for each other between operations, so when another
                process takes one of their cores every operation waits for the descheduled thread: on 2 cores with
                one other busy process, a 1,500-token call took 252 s on 2 threads against 17.9 s on 1. A spare
                core also keeps the event loop, the other services and the agents responsive. With the
                default, steps take every core while a 40 ms look at them finds them idle
                (:class:`~model_proxy.backends._spare_cores.SpareCores`; a fresh look before each prefill step
                of 64 or more prompt tokens, else one up to half a second old): on an idle 2-core machine a
                1,540-token first call took 9.8 s instead of 16.8 s. Set, the number is used for every step.
            slots: Calls decoded together (llama.cpp sequences); more wait for a free slot.
            max_context: Context of each slot in tokens (prompt plus output).
            n_batch: Most tokens per ``llama_decode`` (prompt pieces and decode tokens of all calls).
            chunk_size: Most tokens per streamed chunk.
            spare: What decides that the cores are idle (tests inject one); only used with ``threads`` unset.

        Raises:
            InvalidArgument: A size below 1.
        """
        for what, value in (("slots", slots), ("max_context", max_context), ("n_batch", n_batch)):
            if value < 1:
                raise InvalidArgument(f"llama_cpp backend: {what} must be at least 1, not {value}")
        if threads is not None and threads < 1:
            raise InvalidArgument(f"llama_cpp backend: threads must be at least 1, not {threads}")
        self._gguf = Path(gguf)
        self._threads = threads or max(1, len(os.sched_getaffinity(0)) - 1)
        watch = spare or SpareCores()
        # Every core while they are idle: only with the default threads, and only when that is more.
        self._spare = watch if threads is None and watch.count > self._threads else None
        self._spare_steps = 0
        self._slots_n = slots
        self._max_context = max_context
        self._n_batch = min(n_batch, slots * max_context)  # llama.cpp caps a batch at the context
        self._chunk_size = max(1, chunk_size)
        self._cond = threading.Condition()
        # Guarded by self._cond:
        self._waiting: collections.deque[_Job] = collections.deque()
        self._controls: collections.deque[tuple[Callable[[], None], concurrent.futures.Future[None]]] = (
            collections.deque()
        )
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loaded: _Loaded | None = None
        self._slots: list[_Slot] = []
        self._active: list[_Job] = []
        self._clock = 0
        self._prefilled = 0
        self._start_lock = asyncio.Lock()
        self._exported: Path | None = None  # a temporary folder holding a GGUF exported by load_weights
        self._template: GgufTemplate | None = None  # what a checkpoint must hold (from the first GGUF served)

    @property
    def prefilled_tokens(self) -> int:
        """Prompt tokens run through the model so far (a reused prefix is not counted); for tests and metrics."""
        return self._prefilled

    @property
    def context_length(self) -> int:
        """Context of one call in tokens (prompt plus output)."""
        return self._max_context

    @property
    def gguf(self) -> Path:
        """The GGUF file served now."""
        return self._gguf

    async def start(self) -> None:
        """Load the model and start the worker thread; idempotent.

        Raises:
            BackendUnavailable: llama.cpp is not installed or the GGUF cannot be loaded.
        """
        async with self._start_lock:
            if self._thread is not None:
                return
            try:
                loaded = await asyncio.to_thread(self._open, self._gguf)
            except (ImportError, OSError, RuntimeError) as exc:
                raise BackendUnavailable(f"llama_cpp backend: cannot load {self._gguf}: {exc}") from exc
            if self._template is None:
                try:
                    self._template = await asyncio.to_thread(read_template, self._gguf)
                except (OSError, ValueError, KeyError) as exc:
                    self._free(loaded)
                    raise BackendUnavailable(f"llama_cpp backend: cannot read {self._gguf}: {exc}") from exc
            self._loaded = loaded
            self._slots = [_Slot(i) for i in range(self._slots_n)]
            self._stopping = False
            self._thread = threading.Thread(target=self._work, name="llama_cpp", daemon=True)
            self._thread.start()

    def _open(self, gguf: Path) -> _Loaded:
        lib, ffi = load_llama_cpp()
        if not gguf.is_file():
            raise OSError(f"no GGUF file at {gguf}")
        model = lib.llama_model_load_from_file(str(gguf).encode(), lib.llama_model_default_params())
        if model == ffi.NULL:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        params = lib.llama_context_default_params()
        params.n_ctx = self._slots_n * self._max_context
        params.n_batch = params.n_ubatch = self._n_batch  # one ubatch per decode: it succeeds or fails whole
        params.n_seq_max = self._slots_n
        params.n_threads = params.n_threads_batch = self._threads
        ctx = lib.llama_init_from_model(model, params)
        if ctx == ffi.NULL:
            lib.llama_model_free(model)
            raise RuntimeError(f"llama.cpp could not create a context of {params.n_ctx} tokens for {gguf}")
        batch = lib.llama_batch_init(self._n_batch, 0, 1)
        vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model)))
        return _Loaded(model, ctx, batch, vocab, gguf)

    @staticmethod
    def _free(loaded: _Loaded) -> None:
        lib, _ = load_llama_cpp()
        lib.llama_batch_free(loaded.batch)
        lib.llama_free(loaded.ctx)
        lib.llama_model_free(loaded.model)

    async def close(self) -> None:
        """Stop the worker (calls still running or waiting fail with ``BackendUnavailable``) and free the model."""
        async with self._start_lock:
            thread = self._thread
            if thread is None:
                return
            with self._cond:
                self._stopping = True
                self._cond.notify_all()
            await asyncio.to_thread(thread.join)
            self._thread = None
            if self._loaded is not None:
                self._free(self._loaded)
                self._loaded = None
            if self._exported is not None:
                shutil.rmtree(self._exported, ignore_errors=True)
                self._exported = None

    async def healthy(self) -> bool:
        """Whether the worker is running with a model loaded."""
        thread = self._thread
        return thread is not None and thread.is_alive() and self._loaded is not None

    # ---- generation

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Sample a response, streaming chunks as tokens are decoded when ``request.stream``.

        Raises:
            BackendUnavailable: :meth:`start` has not run, or the backend closed during the call.
            ContextLengthExceeded: The prompt fills a slot's context.
            MalformedRequest: Empty prompt, IDs outside the vocabulary, bad sampling values or ``max_tokens`` < 1.
        """
        loaded = self._loaded
        if self._thread is None or loaded is None:
            raise BackendUnavailable("llama_cpp backend is not started")
        max_tokens = check_request(request, loaded.vocab, self._max_context)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Item] = asyncio.Queue()

        def emit(item: Item) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        seed = request.sampling.seed
        job = _Job(
            request,
            max_tokens,
            emit,
            np.random.default_rng(seed),
            frozenset(request.stop_token_ids),
        )
        with self._cond:
            if self._stopping or self._thread is None:
                raise BackendUnavailable("llama_cpp backend was closed")
            self._waiting.append(job)
            self._cond.notify_all()
        try:
            async for chunk in chunks(queue, stream=request.stream, chunk_size=self._chunk_size):
                yield chunk
        finally:
            # A finished job is already gone from the worker; one still running stops at its next step.
            with self._cond:
                job.aborted = True
                self._cond.notify_all()

    # ---- weights

    async def check_weights(self, path: str) -> str:
        """Check a checkpoint directory against the served GGUF without loading it; return its architecture.

        Reads ``config.json`` and the safetensors headers only and compares them with the tensors and sizes the
        served GGUF describes (:mod:`model_proxy.backends._gguf_export`).

        Raises:
            FailedPrecondition: Not started, no directory, no config or safetensors files, unreadable headers,
                another architecture or size, or tensors missing, extra or of another shape.
        """
        return (await self._checked(path)).architecture

    async def _checked(self, path: str) -> CheckpointInfo:
        template = self._template
        if template is None:
            raise FailedPrecondition("llama_cpp backend is not started")
        return await asyncio.to_thread(template.check, path)

    async def load_weights(self, path: str) -> None:
        """Re-export the checkpoint to GGUF (float16 matrices, the served file's metadata) and serve it.

        The export runs beside generation; the swap waits for the calls in flight (there are none while the
        proxy is paused) and holds new ones back until the new model is loaded. Any failure leaves the old
        model serving.

        Raises:
            FailedPrecondition: As :meth:`check_weights`, or the export or the load failed.
        """
        candidate = await self._checked(path)
        template = self._template
        assert template is not None
        folder = Path(tempfile.mkdtemp(prefix="polar-llama-cpp-"))
        out = folder / "model.gguf"
        try:
            await asyncio.to_thread(export_checkpoint, template, candidate, out)
            await self._control(lambda: self._swap(out))
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise FailedPrecondition(f"cannot load {path!r}: {exc}") from exc
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        previous, self._exported = self._exported, folder
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)

    def _swap(self, gguf: Path) -> None:
        """In the worker, with no call active: load ``gguf``, then free the old model and forget every cache."""
        loaded = self._open(gguf)
        old, self._loaded = self._loaded, loaded
        self._gguf = gguf
        for slot in self._slots:
            slot.tokens.clear()
        if old is not None:
            self._free(old)

    async def _control(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` in the worker thread once no call is active (new calls wait for it)."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._cond:
            if self._stopping or self._thread is None:
                raise BackendUnavailable("llama_cpp backend is not started")
            self._controls.append((fn, future))
            self._cond.notify_all()
        await asyncio.wrap_future(future)

    @staticmethod
    def _run_control(fn: Callable[[], None], future: concurrent.futures.Future[None]) -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the awaiting caller
            future.set_exception(exc)
        else:
            future.set_result(None)

    # ---- the worker thread

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._waiting and not self._active and not self._controls:
                    self._cond.wait()
                if self._stopping:
                    break
                self._admit()
                control = self._controls.popleft() if self._controls and not self._active else None
            if control is not None:
                self._run_control(*control)
                continue
            if self._active:
                try:
                    self._step()
                except Exception as exc:  # reported to every active caller, never lost in the thread
                    self._fail_active(Internal(f"llama_cpp backend failed while decoding: {exc!r}"))
        with self._cond:
            gone = BackendUnavailable("llama_cpp backend was closed")
            for job in [*self._active, *self._waiting]:
                job.emit(gone)
            self._active.clear()
            self._waiting.clear()
            for _fn, future in self._controls:
                future.set_exception(BackendUnavailable("llama_cpp backend was closed"))
            self._controls.clear()

    def _admit(self) -> None:
        """Give waiting calls free slots, first come first served (holding ``self._cond``).

        Calls wait while a control task (a weight swap) is queued, so it runs once the active ones finish.
        """
        while self._waiting and not self._controls:
            job = self._waiting[0]
            if job.aborted:
                self._waiting.popleft()
                continue
            free = [s for s in self._slots if s.job is None]
            if not free:
                return
            self._waiting.popleft()
            prompt = list(job.request.prompt_token_ids)
            limit = len(prompt) - 1  # the last prompt token is run again for its logits
            best = max(free, key=lambda s: (_shared_prefix(s.tokens, prompt, limit), -s.last_used))
            keep = _shared_prefix(best.tokens, prompt, limit)
            lib, _ = load_llama_cpp()
            assert self._loaded is not None
            lib.llama_kv_cache_seq_rm(self._loaded.ctx, best.seq_id, keep, -1)
            del best.tokens[keep:]
            self._clock += 1
            best.last_used = self._clock
            best.job = job
            job.slot = best.seq_id
            job.pending = prompt[keep:]
            job.pos = keep
            self._prefilled += len(job.pending)
            self._active.append(job)

    def _release(self, job: _Job) -> None:
        with self._cond:
            if job in self._active:
                self._active.remove(job)
            if job.slot >= 0:
                self._slots[job.slot].job = None

    def _fail_active(self, error: BaseException) -> None:
        """Fail every active call and forget its slot's cache (what it holds is unknown after a failed step)."""
        lib, _ = load_llama_cpp()
        for job in list(self._active):
            job.emit(error)
            slot = self._slots[job.slot]
            if self._loaded is not None:
                lib.llama_kv_cache_seq_rm(self._loaded.ctx, slot.seq_id, 0, -1)
            slot.tokens.clear()
            self._release(job)

    def _pick_threads(self, loaded: _Loaded, prompt_tokens: int) -> None:
        """Set the threads of the next ``llama_decode``: every core while they are idle (a fresh look before a
        prefill step, one at most ``_SPARE_LOOK_EVERY_S`` old otherwise; see ``threads`` in :meth:`__init__`),
        else the default."""
        if self._spare is None:
            return
        if prompt_tokens >= _SPARE_MIN_PROMPT_TOKENS:
            idle = self._spare.idle()
        else:
            idle = self._spare.idle_lately(_SPARE_LOOK_EVERY_S)
        want = self._spare.count if idle else self._threads
        self._spare_steps += idle
        if want != (loaded.threads or self._threads):
            lib, _ = load_llama_cpp()
            lib.llama_set_n_threads(loaded.ctx, want, want)
            loaded.threads = want

    @property
    def spare_core_steps(self) -> int:
        """Steps run on every core because they were idle (since start)."""
        return self._spare_steps

    def _step(self) -> None:
        """One ``llama_decode`` over every active call, then one sampled token for each that finished its prompt."""
        lib, ffi = load_llama_cpp()
        loaded = self._loaded
        assert loaded is not None
        for job in [j for j in self._active if j.aborted]:
            self._release(job)
        # Decode tokens first so that a long prompt never delays the calls already generating.
        jobs = sorted(self._active, key=lambda j: j.produced == 0)
        batch = loaded.batch
        n = 0
        prompt_n = 0
        sample: list[tuple[_Job, int]] = []
        for job in jobs:
            room = self._n_batch - n
            if room <= 0:
                break
            take = job.pending[:room]
            if job.produced == 0:
                prompt_n += len(take)
            slot = self._slots[job.slot]
            for i, token in enumerate(take):
                batch.token[n] = token
                batch.pos[n] = job.pos + i
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = slot.seq_id
                batch.logits[n] = 0
                n += 1
            job.pos += len(take)
            slot.tokens.extend(take)
            del job.pending[: len(take)]
            if not job.pending:
                batch.logits[n - 1] = 1
                sample.append((job, n - 1))
        if n == 0:
            return
        batch.n_tokens = n
        self._pick_threads(loaded, prompt_n)
        status = lib.llama_decode(loaded.ctx, batch)
        if status == 1:
            # No contiguous room in the KV cache: drop the idle slots' caches, compact, and try once more.
            for slot in self._slots:
                if slot.job is None and slot.tokens:
                    lib.llama_kv_cache_seq_rm(loaded.ctx, slot.seq_id, 0, -1)
                    slot.tokens.clear()
            lib.llama_kv_cache_defrag(loaded.ctx)
            lib.llama_kv_cache_update(loaded.ctx)
            status = lib.llama_decode(loaded.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")
        for job, index in sample:
            raw = ffi.buffer(lib.llama_get_logits_ith(loaded.ctx, index), loaded.vocab * 4)
            logits = np.frombuffer(raw, dtype=np.float32)
            token, logprob = sample_logits(logits, job.request.sampling, job.rng)
            job.produced += 1
            finish: str | None = None
            if token in job.stops:
                finish = "stop"
            elif job.produced >= job.max_tokens:
                finish = "length"
            job.emit(SampledToken(token, logprob, finish))
            if finish is not None:
                self._release(job)
            else:
                job.pending = [token]
