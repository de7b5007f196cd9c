"""Decoding a session's request body without decoding again what its last body already held.

An agent loop resends its whole history (and its tools) on every call: a 35k-token turn's ~100 kB body is the
last body plus two messages. :func:`decode_with_memo` walks the body's top-level object itself and hands every
value to :mod:`json`'s own scanner, except the leading elements of a top-level array whose JSON text is, char
for char, the text the session's last body had there: those get the values decoded then (the same objects, so
the translation memo recognises them without comparing anything). A JSON text that starts with another's
complete text, followed by a ``,`` or the ``]`` closing the array, holds the same value there, whatever the
value's type: the scanner would read exactly those chars again.

Only a well-formed object of at most ``_MAX_ITEMS`` keys, whose arrays have at most ``_MAX_ITEMS`` elements, is
walked; anything else (another top-level value, a syntax error, a byte-order mark)
returns None, and the caller decodes the body the usual way, which gives the usual value or error. Decoded
values are shared with the next request: nothing may change them in place (no adapter does).
"""

from __future__ import annotations

import dataclasses
import json
import json.scanner
from collections.abc import Callable
from typing import Any

__all__ = ["BodyMemo", "Scan", "decode_with_memo", "scanner"]

_WHITESPACE = frozenset(" \t\n\r")  # JSON's whitespace (json.decoder.WHITESPACE)
_MAX_ITEMS = 4096
"""Top-level keys, and elements of one array, that the walk handles one by one (a Python step each); a body with
more is decoded the usual way, so a body of a million tiny elements costs what ``json.loads`` costs, not more."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Array:
    """A top-level array: its elements' values, and its text from the first element's start to the last's end
    (separators as the client wrote them) with each element's span in that text."""

    values: list[Any]
    text: str
    spans: list[tuple[int, int]]


class BodyMemo:
    """The top-level arrays of a session's last decoded body (their text and decoded elements), by key."""

    def __init__(self) -> None:
        self._arrays: dict[str, _Array] = {}

    def clear(self) -> None:
        """Forget the last body (its session closed)."""
        self._arrays = {}


Scan = Callable[[str, int], tuple[Any, int]]
"""``json``'s scanner: the value starting at an index of a text, and the index after it."""


def scanner(decoder: json.JSONDecoder) -> Scan:
    """The scanner of ``decoder`` (its hooks, ``parse_float`` and ``parse_constant``, apply to every value)."""
    scan: Scan = json.scanner.make_scanner(decoder)  # type: ignore[arg-type]
    return scan


def decode_with_memo(text: str, memo: BodyMemo, scan: Scan) -> dict[str, Any] | None:
    """Decode ``text`` (a JSON object) reusing ``memo``'s values where the text is the same, and update ``memo``.

    Args:
        text: The body as text.
        memo: The session's memo.
        scan: The :func:`scanner` every value is decoded with.

    Returns:
        The decoded object, or None when ``text`` is not a well-formed JSON object (decode it the usual way).
    """
    try:
        return _walk(text, memo, scan)
    except (StopIteration, ValueError, IndexError, RecursionError):  # malformed: the usual decode says how
        return None


def _skip(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in _WHITESPACE:
        i += 1
    return i


def _walk(text: str, memo: BodyMemo, scan: Scan) -> dict[str, Any] | None:
    n = len(text)
    i = _skip(text, 0)
    if i >= n or text[i] != "{":
        return None
    obj: dict[str, Any] = {}
    arrays: dict[str, _Array] = {}
    last = memo._arrays
    i = _skip(text, i + 1)
    if i < n and text[i] == "}":
        return obj if _skip(text, i + 1) == n else None
    while True:
        if i >= n or text[i] != '"' or len(obj) >= _MAX_ITEMS:
            return None
        key, i = scan(text, i)
        i = _skip(text, i)
        if i >= n or text[i] != ":":
            return None
        i = _skip(text, i + 1)
        if i < n and text[i] == "[":
            array, i = _array(text, i, last.get(key), scan)
            if array is None:
                return None
            obj[key] = array.values
            arrays[key] = array
        else:
            obj[key], i = scan(text, i)
            arrays.pop(key, None)  # a repeated key: the last value wins, as in json.loads
        i = _skip(text, i)
        if i >= n:
            return None
        if text[i] == ",":
            i = _skip(text, i + 1)
            continue
        if text[i] != "}" or _skip(text, i + 1) != n:
            return None
        memo._arrays = arrays
        return obj


def _ends_value(text: str, end: int) -> int:
    """The index of the ``,`` or ``]`` after the value ending at ``end`` (after whitespace), or -1."""
    j = _skip(text, end)
    return j if j < len(text) and text[j] in ",]" else -1


def _array(text: str, i: int, last: _Array | None, scan: Scan) -> tuple[_Array | None, int]:
    """The array whose ``[`` is at ``i``, and the index after its ``]``."""
    n = len(text)
    i = _skip(text, i + 1)
    if i < n and text[i] == "]":
        return _Array([], "", []), i + 1
    start = i
    values: list[Any] = []
    spans: list[tuple[int, int]] = []
    if last is not None and last.values and text.startswith(last.text, i):
        # The usual case: the last body's elements, then new ones (one comparison of ~100 kB).
        j = _ends_value(text, i + len(last.text))
        if j >= 0:
            values, spans = list(last.values), list(last.spans)
            i = j
            if text[i] == "]":
                return _Array(values, last.text, spans), i + 1
            i = _skip(text, i + 1)
    while True:
        k = len(values)
        if len(spans) >= _MAX_ITEMS:
            return None, i
        end = -1
        if last is not None and k < len(last.spans):
            a, b = last.spans[k]
            if text.startswith(last.text[a:b], i) and _ends_value(text, i + b - a) >= 0:
                values.append(last.values[k])
                end = i + b - a
        if end < 0:
            value, end = scan(text, i)
            values.append(value)
        spans.append((i - start, end - start))
        i = _skip(text, end)
        if i >= n:
            return None, i
        if text[i] == ",":
            i = _skip(text, i + 1)
            continue
        if text[i] != "]":
            return None, i
        return _Array(values, text[start:end], spans), i + 1
