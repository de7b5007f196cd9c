"""A session's memory of its last request's messages, so an agent loop's next turn translates only what is new.

An agent resends its whole history on every call: a 35k-token Claude Code turn repeats ~150 messages of which
two are new. A protocol adapter that is given the session's :class:`TranslationMemo` validates and translates
only the messages after the longest run, from the first message on, that is the same as last time, and reuses
the :class:`~model_proxy.models.ChatMessage` objects (and the notes of what was ignored) it made for the rest.

"The same" is decided on the :mod:`marshal` form of each raw JSON message (version 2: no back-references):
marshal writes every value with its type, so equal bytes mean equal values of equal types in the same key
order (``==`` cannot tell ``1``, ``1.0`` and ``true`` apart, which a template's ``tojson`` prints differently).
A message's translation depends only on the messages before it, so a message whose prefix is unchanged
translates as it did. The reused objects are shared between calls: nothing may change a translated
:class:`~model_proxy.models.ChatMessage` in place (normalisation rules replace the messages they edit).

The memo holds the raw messages' marshal bytes (about the size of the request body) until the session closes.
"""

from __future__ import annotations

import dataclasses
import marshal
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from model_proxy.models import ChatMessage

_Turn = TypeVar("_Turn")

__all__ = ["Messages", "Reuse", "Translated", "TranslationMemo", "reuse_for", "translate_new"]


@dataclasses.dataclass(frozen=True, slots=True)
class Reuse:
    """What a request may take from the memo: the first ``count`` raw messages' translations.

    Attributes:
        count: Leading raw messages that are the same as in the last request.
        outputs: For each of them, the messages it translated to (one raw message may give several or none).
        notes: For each of them, what its translation ignored.
    """

    count: int
    outputs: tuple[tuple[ChatMessage, ...], ...]
    notes: tuple[tuple[str, ...], ...]


_NONE = Reuse(0, (), ())


@dataclasses.dataclass(frozen=True, slots=True)
class Messages:
    """A request's raw messages and their keys (what :meth:`TranslationMemo.remember` keeps)."""

    raw: tuple[Any, ...]
    keys: tuple[bytes, ...]


def reuse_for(body: Any, memo: TranslationMemo | None) -> tuple[Messages | None, Reuse]:
    """``body["messages"]`` with their keys (None without a memo or a message list) and what ``memo`` offers.

    Callers validate and translate ``body["messages"][reuse.count:]`` only, then :meth:`TranslationMemo.remember`
    the messages with every one's translation.
    """
    raw = body.get("messages") if memo is not None and isinstance(body, dict) else None
    if memo is None or not isinstance(raw, list):
        return None, _NONE
    messages = memo.keys(raw)
    return messages, _NONE if messages is None else memo.reuse(messages.keys)


def _tool_names(outputs: Sequence[tuple[ChatMessage, ...]]) -> dict[str, str]:
    """Tool names by tool call id, from the tool calls of translated messages (a later call wins)."""
    return {call.id: call.name for out in outputs for message in out for call in message.tool_calls}


@dataclasses.dataclass(frozen=True, slots=True)
class Translated:
    """Every raw message's translation and notes (the reused ones first), as :meth:`TranslationMemo.remember`
    keeps them."""

    outputs: list[tuple[ChatMessage, ...]]
    notes: list[tuple[str, ...]]

    @property
    def messages(self) -> list[ChatMessage]:
        """The chat messages, in order."""
        return [message for out in self.outputs for message in out]

    @property
    def ignored(self) -> list[str]:
        """What the translations ignored, in order."""
        return [note for notes in self.notes for note in notes]


def translate_new(
    turns: Iterable[_Turn],
    reuse: Reuse,
    translate: Callable[[_Turn, dict[str, str], list[str]], tuple[ChatMessage, ...]],
) -> Translated:
    """``reuse``'s translations, then ``translate(turn, names, ignored)`` of each new turn (validated).

    ``names`` maps the tool call ids seen so far, the reused ones included, to their tool (``translate`` adds
    the new ones); ``ignored`` collects what one turn's translation dropped.
    """
    names = _tool_names(reuse.outputs)
    outputs = list(reuse.outputs)
    notes = list(reuse.notes)
    for turn in turns:
        note: list[str] = []
        outputs.append(translate(turn, names, note))
        notes.append(tuple(note))
    return Translated(outputs, notes)


@dataclasses.dataclass(frozen=True, slots=True)
class _Last:
    messages: Messages
    outputs: tuple[tuple[ChatMessage, ...], ...]
    notes: tuple[tuple[str, ...], ...]


class TranslationMemo:
    """The last request's raw messages (as marshal bytes) and what each translated to (one protocol's)."""

    def __init__(self) -> None:
        self._last: _Last | None = None

    def keys(self, raw: Sequence[Any]) -> Messages | None:
        """``raw`` with each message's key (None when one has none): a message that is the very object the last
        request had at its place (the body memo hands them out again) keeps its key without marshalling it."""
        last = self._last
        known = last.messages if last is not None else Messages((), ())
        # The usual case first, in C: the request starts with the very objects of the last one.
        n = len(known.raw)
        same = n if n <= len(raw) and all(map(operator.is_, raw, known.raw)) else 0
        keys = list(known.keys[:same])
        try:
            for i in range(same, len(raw)):
                message = raw[i]
                keys.append(known.keys[i] if i < n and known.raw[i] is message else marshal.dumps(message, 2))
        except ValueError:  # not JSON data: never reused
            return None
        return Messages(tuple(raw), tuple(keys))

    def reuse(self, keys: Sequence[bytes]) -> Reuse:
        """The translations of the leading messages whose keys are the last request's (never of the last one)."""
        last = self._last  # one read: a concurrent remember() replaces it whole
        if last is None:
            return _NONE
        count = 0
        # The last message is always validated again: a request model may require at least one message, and a
        # request resent as it was (a retry) must still validate.
        for new, old in zip(keys[:-1], last.messages.keys, strict=False):
            if new != old:
                break
            count += 1
        if not count:
            return _NONE
        return Reuse(count, last.outputs[:count], last.notes[:count])

    def remember(self, messages: Messages, translated: Translated) -> None:
        """Keep this request's messages and their translations (one per raw message) for the next request."""
        if not len(messages.keys) == len(translated.outputs) == len(translated.notes):
            raise ValueError("one translation and one note tuple per message")
        self._last = _Last(messages, tuple(translated.outputs), tuple(translated.notes))

    def clear(self) -> None:
        """Forget the last request (its session closed)."""
        self._last = None
