"""What the in-process backends (``transformers``, ``llama_cpp``) share: request checks and the token stream.

Both decode in a worker thread that hands each sampled token (or an error) to the event loop through an asyncio
queue; :func:`chunks` turns that queue into the :class:`~model_proxy.models.GenerationChunk` stream a backend
yields.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from model_proxy.errors import ContextLengthExceeded, MalformedRequest
from model_proxy.models import GenerationChunk, GenerationRequest

__all__ = ["Item", "SampledToken", "check_request", "chunks"]


@dataclasses.dataclass(frozen=True, slots=True)
class SampledToken:
    """One token from the worker: its ID, its log-probability and, on the last one, why the call ended."""

    token_id: int
    logprob: float
    finish_reason: str | None


Item = SampledToken | BaseException
"""What the worker puts on a call's queue: a token, or the error that ends the call."""


def check_request(request: GenerationRequest, vocab: int, limit: int) -> int:
    """Check a call against the model's vocabulary size and context ``limit``; return its output budget.

    ``max_tokens`` is clamped to the room left rather than refused: the proxy resolves it to that room anyway.

    Raises:
        MalformedRequest: Empty prompt, IDs outside the vocabulary, bad sampling values or ``max_tokens`` < 1.
        ContextLengthExceeded: The prompt fills the context.
    """
    prompt = request.prompt_token_ids
    if not prompt:
        raise MalformedRequest("the prompt has no tokens")
    if min(prompt) < 0 or max(prompt) >= vocab:
        raise MalformedRequest(f"prompt token IDs must lie in [0, {vocab})")
    if len(prompt) >= limit:
        raise ContextLengthExceeded(len(prompt), limit)
    sampling = request.sampling
    if sampling.temperature < 0.0 or not 0.0 < sampling.top_p <= 1.0:
        raise MalformedRequest("temperature must be >= 0 and top_p in (0, 1]")
    max_tokens = sampling.max_tokens
    if max_tokens is not None and max_tokens < 1:
        raise MalformedRequest(f"max_tokens must be at least 1, got {max_tokens}")
    room = limit - len(prompt)
    return room if max_tokens is None else min(max_tokens, room)


async def chunks(queue: asyncio.Queue[Item], *, stream: bool, chunk_size: int) -> AsyncIterator[GenerationChunk]:
    """Yield a call's tokens from ``queue`` until one carries a finish reason; raise an error put there.

    Streamed, chunks of up to ``chunk_size`` tokens as they arrive; otherwise one chunk at the end.
    """
    ids: list[int] = []
    logprobs: list[float] = []
    finish: str | None = None
    while finish is None:
        items = [await queue.get()]
        while not queue.empty() and len(ids) + len(items) < chunk_size:
            items.append(queue.get_nowait())
        for item in items:
            if isinstance(item, BaseException):
                raise item
            ids.append(item.token_id)
            logprobs.append(item.logprob)
            finish = item.finish_reason
        if stream and (len(ids) >= chunk_size or finish is not None):
            yield GenerationChunk(tuple(ids), tuple(logprobs), finish)
            ids, logprobs = [], []
    if not stream:
        yield GenerationChunk(tuple(ids), tuple(logprobs), finish)
