"""Per-session memory of recently rendered prompts, for incremental rendering and tokenisation.

Each :class:`CacheEntry` keeps a prompt's text, its token IDs (and their JSON text, so a completion record of
a 35k-token prompt does not serialise 35k integers again), the positions right after each *boundary* token
(an added token such as ``<|im_end|>``, after which Hugging Face tokenizers tokenise independently), and,
when it came from :meth:`~model_proxy.core.render.ChatRenderer.render`, the template messages and tools it
renders and the length of its text without the generation prompt.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, TypeVar

from model_proxy.core.template import ClockReading
from model_proxy.models import ChatMessage

__all__ = ["CacheEntry", "MessageDicts", "PrefixCache", "common_prefix_len", "ids_json"]

_COMPACT = json.JSONEncoder(separators=(",", ":"))


@dataclasses.dataclass(slots=True)
class CacheEntry:
    """One remembered prompt.

    Attributes:
        text: The rendered prompt (with the generation prompt).
        ids: Its token IDs.
        ids_json: ``ids`` as comma-separated decimals (the inside of their JSON array).
        boundary_chars: Character offsets right after each boundary token, ascending.
        boundary_tokens: Number of IDs up to and including that boundary token.
        boundary_json: Length of ``ids_json`` covering those IDs.
        call_id: The call that rendered it ("" for none).
        messages: The template messages ``text`` renders (None when unknown).
        tools: The tools passed to the template with them.
        base_len: Length of ``text`` without the generation prompt; -1 when unknown.
        clock: ``strftime_now`` readings the template made while rendering it.
    """

    text: str
    ids: list[int]
    ids_json: str
    boundary_chars: list[int]
    boundary_tokens: list[int]
    boundary_json: list[int]
    call_id: str = ""
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    base_len: int = -1
    clock: list[ClockReading] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class MessageDicts:
    """The messages of a session's last render and the dicts made from them, one each, in order.

    A message object the next render is given again (the session's translation memo reuses them) is not
    turned into dicts again: the same dicts make the prefix comparisons identity checks, and let the record's
    line reuse their JSON text. Neither the messages nor the dicts are ever changed once made.

    Attributes:
        sources: The messages.
        conversation: ``m.to_template_dict()`` of each (what the completion record keeps).
        prepared: :func:`~model_proxy.core.template.template_message` of each (what the template renders).
    """

    sources: tuple[ChatMessage, ...]
    conversation: tuple[dict[str, Any], ...]
    prepared: tuple[dict[str, Any], ...]


class PrefixCache:
    """Recently rendered prompts of one session (least recently used dropped first)."""

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._entries: list[CacheEntry] = []  # oldest first (a few entries: no dict keyed by ~100 kB texts to hash)
        self._dicts: MessageDicts | None = None

    @property
    def dicts(self) -> MessageDicts | None:
        """The last render's messages and their dicts (None before the first, or when the cache keeps nothing)."""
        return self._dicts

    @dicts.setter
    def dicts(self, value: MessageDicts) -> None:
        if self._max > 0:
            self._dicts = value

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, text: str) -> tuple[CacheEntry | None, int]:
        """Return the entry sharing the longest prefix with ``text`` and that prefix's length."""
        best: CacheEntry | None = None
        best_len = 0
        for entry in reversed(self._entries):
            n = common_prefix_len(text, entry.text)
            if n > best_len:
                best, best_len = entry, n
        return best, best_len

    def extendable(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> CacheEntry | None:
        """The most recent entry whose messages start ``messages`` with the same tools (None when none does)."""
        n = len(messages)
        for entry in reversed(self._entries):
            old = entry.messages
            if old is None or entry.base_len < 0 or not 0 < len(old) <= n:
                continue
            if entry.tools == tools and messages[: len(old)] == old:
                return entry
        return None

    def add(self, entry: CacheEntry) -> None:
        """Remember ``entry`` (replacing an entry with the same text)."""
        if self._max <= 0:
            return
        size = len(entry.text)
        self._entries = [e for e in self._entries if len(e.text) != size or e.text != entry.text]
        self._entries.append(entry)
        del self._entries[: -self._max]

    def parent_of(self, text: str) -> str | None:
        """The most recent call whose whole prompt is a prefix of ``text``."""
        for entry in reversed(self._entries):
            if entry.call_id and text.startswith(entry.text):
                return entry.call_id
        return None


_Seq = TypeVar("_Seq", str, list[int])


def common_prefix_len(a: _Seq, b: _Seq) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, two texts or two ID lists (linear: each step
    compares only what is new)."""
    if a.startswith(b) if isinstance(a, str) else len(b) <= len(a) and a[: len(b)] == b:
        return len(b)
    lo, hi = 0, min(len(a), len(b))
    # Invariant: a[:lo] == b[:lo] and the answer is at most hi. Slices compare with memcmp.
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def ids_json(ids: list[int], cuts: list[int]) -> tuple[str, list[int]]:
    """Return ``",".join(map(str, ids))`` and its length after each of ``cuts`` IDs (ascending, >= 1)."""
    pieces: list[str] = []
    offsets: list[int] = []
    length = 0
    prev = 0
    for cut in cuts:
        piece = _COMPACT.encode(ids[prev:cut])[1:-1]
        length += len(piece) + (1 if pieces else 0)
        pieces.append(piece)
        offsets.append(length)
        prev = cut
    if prev < len(ids):
        pieces.append(_COMPACT.encode(ids[prev:])[1:-1])
    return ",".join(pieces), offsets
