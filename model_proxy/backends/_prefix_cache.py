"""The KV caches of the in-process backend's last calls, kept so a call can skip the prefill of a shared prefix.

An agent's calls grow one conversation: call *n + 1*'s prompt is call *n*'s prompt, its answer and a tool
result, and every session of a task starts with the same system prompt and tools. Re-running the forward
pass over that prefix was most of a call's time on CPU (1,582 prompt tokens against 128 sampled ones).

Each entry is a transformers ``Cache`` and the exact token IDs whose keys and values it holds. A call takes
the entry sharing the longest prefix with its prompt out of the store, crops it and feeds only the rest;
when it ends, the cache (now holding its prompt and all but the last sampled token) goes back in. An entry
is used by one call at a time (it is taken out), and one whose forward pass failed half-way is never put
back, so an entry's IDs always describe its keys and values exactly.

**Same answer with or without the cache.** The backend prefills a prompt in blocks of ``block`` positions
aligned on absolute positions (``[0, block)``, ``[block, 2 block)``, ..., then the remainder), and an entry
is only reused up to a whole number of blocks that were computed as such (``aligned``), never into a
partial block or the one-at-a-time decoding steps. So every forward pass a call runs (same block, same
cached keys and values before it, same shapes) is the one it would run on an empty store, and a seeded call
gives bit-identical tokens and log-probabilities whatever earlier calls left behind; reusing a prefix only
skips work. (Reusing up to any position would change the floating-point summation order and the
log-probabilities by about 1e-6.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

__all__ = ["CacheEntry", "PrefixCache", "common_prefix_length", "new_cache"]

_MIN_CAPACITY = 256


def new_cache(config: Any) -> Any:
    """An empty ``DynamicCache`` for ``config`` whose full-attention layers grow in place (:class:`_GrowingLayer`).

    transformers' ``DynamicLayer`` appends each step's keys and values with ``torch.cat``, copying the whole
    cache every token: 74 MB per token for SmolLM2 at 1,600 positions, about 30 % of a decoding step on two
    cores. Other layer kinds (sliding windows, linear attention) are left as transformers makes them.
    """
    cache = DynamicCache(config=config)
    layers = getattr(cache, "layers", None)
    if isinstance(layers, list):
        cache.layers = [_GrowingLayer() if type(layer) is DynamicLayer else layer for layer in layers]  # type: ignore[no-untyped-call]
    return cache


class _GrowingLayer(DynamicLayer):  # type: ignore[misc,no-untyped-call]
    """A ``DynamicLayer`` over buffers with spare room: appending writes in place, doubling when full.

    ``keys`` and ``values`` are views of the buffers' first positions, so everything that reads them
    (attention, ``get_seq_length``, ``crop``) sees exactly what ``DynamicLayer`` would hold.
    """

    _buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._buffers = None
        held = self.get_seq_length()
        end = held + key_states.shape[-2]
        if self._buffers is None or end > self._buffers[0].shape[-2]:
            capacity = max(_MIN_CAPACITY, 2 * end)
            grown: list[torch.Tensor] = []
            held_keys: Any = self.keys
            held_values: Any = self.values
            for old, new in ((held_keys, key_states), (held_values, value_states)):
                buffer = new.new_empty((*new.shape[:-2], capacity, new.shape[-1]))
                if held:
                    buffer[..., :held, :] = old
                grown.append(buffer)
            self._buffers = (grown[0], grown[1])
        keys, values = self._buffers
        keys[..., held:end, :] = key_states
        values[..., held:end, :] = value_states
        self.keys, self.values = keys[..., :end, :], values[..., :end, :]
        return self.keys, self.values

    def reset(self) -> None:
        self._buffers = None
        super().reset()


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """The number of leading positions at which ``a`` and ``b`` hold the same ID."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: bisect on slice equality (C speed)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if list(a[lo:mid]) == list(b[lo:mid]):
            lo = mid
        else:
            hi = mid
    return lo


@dataclasses.dataclass(slots=True)
class CacheEntry:
    """A KV cache, the token IDs whose keys and values it holds, and how many of them were prefilled in blocks.

    Attributes:
        cache: A transformers ``Cache``.
        token_ids: The IDs whose keys and values ``cache`` holds, in order.
        aligned: The leading positions computed as whole aligned blocks (a multiple of the block size).
    """

    cache: Any
    token_ids: list[int]
    aligned: int = 0


class PrefixCache:
    """At most ``capacity`` caches of recent calls, most recently returned first.

    Not thread-safe: the backend uses it from its single decoding thread.

    Args:
        capacity: Most entries kept (0: none).
        block: The prefill block size; reuse stops at a multiple of it.
    """

    def __init__(self, capacity: int, block: int) -> None:
        self.capacity = max(0, capacity)
        self.block = max(1, block)
        self._entries: list[CacheEntry] = []
        self.reused_tokens = 0  # prompt tokens whose prefill was skipped, since creation (for benches and tests)

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, prompt: Sequence[int]) -> CacheEntry | None:
        """Remove and return the entry sharing the most reusable prefix with ``prompt``, cropped to it.

        Reusable: whole aligned blocks of the common prefix, leaving at least the prompt's last token to feed
        (its logits give the first sampled token). None when no entry shares a whole block with the prompt,
        or the best one cannot be cropped.
        """
        best: CacheEntry | None = None
        keep = 0
        for entry in self._entries:
            length = min(common_prefix_length(entry.token_ids, prompt), entry.aligned, len(prompt) - 1)
            length -= length % self.block
            if length > keep:
                best, keep = entry, length
        if best is None:
            return None
        self._entries.remove(best)
        held = best.cache.get_seq_length() if hasattr(best.cache, "get_seq_length") else len(best.token_ids)
        if held != len(best.token_ids):
            return None  # the cache does not hold what its IDs say: never feed from it
        surplus = len(best.token_ids) - keep
        if surplus:
            if not getattr(best.cache, "is_croppable", True):
                return None  # e.g. a sliding-window layer already dropped what a rollback would need
            # transformers 5: a negative count removes that many positions from the end.
            best.cache.crop(-surplus)
            del best.token_ids[keep:]
        best.aligned = keep
        self.reused_tokens += keep
        return best

    def put(self, entry: CacheEntry) -> None:
        """Keep ``entry`` as the most recent one; the oldest beyond ``capacity`` are dropped."""
        if self.capacity == 0 or not entry.token_ids:
            return
        self._entries.insert(0, entry)
        del self._entries[self.capacity :]

    def clear(self) -> None:
        """Drop every entry (new weights make every cached key and value stale)."""
        self._entries.clear()
