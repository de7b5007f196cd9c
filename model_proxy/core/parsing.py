"""Turning sampled IDs into text, reasoning and tool calls, incrementally.

Three stages, each fed deltas and flushed at the end, so a streamed answer and a non-streamed one are built
by the same code and come out identical:

1. :class:`IncrementalDecoder` turns sampled IDs into text deltas (holding back incomplete UTF-8 sequences).
2. :class:`StopTrimmer` cuts the text at the first stop string (holding back a possible partial match).
3. An :class:`OutputParser` stream (``hermes``: Qwen/Hermes ``<tool_call>{json}</tool_call>`` and
   ``<think>...</think>``) splits text into answer, reasoning and tool-call events.

A tool call whose body is not ``{"name": str, "arguments": object}`` JSON is returned as text and
``tool_call_parse_error`` is set on the output (and the record).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from model_proxy.core.events import OutputEvent, ReasoningDelta, TextDelta, ToolCallDone
from model_proxy.models import ParsedOutput, ToolCall
from polar_core.errors import InvalidArgument

__all__ = [
    "HermesParser",
    "IncrementalDecoder",
    "OutputParser",
    "OutputStream",
    "StopTrimmer",
    "TokenDecoder",
    "create_parser",
]


class TokenDecoder(Protocol):
    """The part of a tokenizer used to decode sampled IDs."""

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str:
        """Return the text of ``token_ids``."""
        ...


class IncrementalDecoder:
    """Decodes a growing list of IDs into text deltas whose concatenation equals the full decode."""

    def __init__(self, tokenizer: TokenDecoder) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._emitted = ""
        self._prefix_offset = 0
        self._read_offset = 0

    def feed(self, token_ids: Sequence[int]) -> str:
        """Add sampled IDs; return the text they completed (possibly empty)."""
        self._ids.extend(token_ids)
        prefix = self._tok.decode(self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=True)
        window = self._tok.decode(self._ids[self._prefix_offset :], skip_special_tokens=True)
        if len(window) <= len(prefix) or window.endswith("\ufffd") or not window.startswith(prefix):
            return ""
        delta = window[len(prefix) :]
        # Keep a few tokens of context: byte-level merges can change how the window's start decodes.
        self._prefix_offset = max(self._read_offset, len(self._ids) - 4)
        self._read_offset = len(self._ids)
        self._emitted += delta
        return delta

    def flush(self) -> str:
        """Return whatever the full decode has that the deltas did not emit yet."""
        full = self._tok.decode(self._ids, skip_special_tokens=True)
        if full.startswith(self._emitted):
            rest = full[len(self._emitted) :]
            self._emitted = full
            return rest
        # Windowed decoding disagreed with the full decode (exotic decoders): keep what was sent.
        return ""


class StopTrimmer:
    """Cuts streamed text at the first occurrence of any stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._buf = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Add text; return the part that is certainly before any stop string."""
        if self.matched is not None:
            return ""
        if not self._stops:
            return text
        self._buf += text
        hits = [(self._buf.find(s), s) for s in self._stops]
        found = [(i, s) for i, s in hits if i >= 0]
        if found:
            index, stop = min(found)
            self.matched = stop
            out, self._buf = self._buf[:index], ""
            return out
        cut = max(0, len(self._buf) - self._hold)
        out, self._buf = self._buf[:cut], self._buf[cut:]
        return out

    def flush(self) -> str:
        """Return the held-back tail (no stop string was completed)."""
        out, self._buf = self._buf, ""
        return "" if self.matched is not None else out


class OutputStream(Protocol):
    """One response being parsed."""

    def feed(self, text: str) -> list[OutputEvent]:
        """Add decoded text; return the events it completes."""
        ...

    def finish(self) -> list[OutputEvent]:
        """Flush at the end of the response; return the remaining events."""
        ...

    def result(self) -> ParsedOutput:
        """The whole parsed output (after :meth:`finish`)."""
        ...


class OutputParser(Protocol):
    """A model output format (tool calls and reasoning), pluggable by name."""

    name: str

    def stream(self, make_tool_call_id: Callable[[int], str]) -> OutputStream:
        """Start parsing one response; ``make_tool_call_id(index)`` names its tool calls."""
        ...


def _partial_suffix(text: str, tags: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``tags``."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


class _Segment:
    """Emits one stripped text segment incrementally: leading whitespace dropped, trailing held back."""

    def __init__(self) -> None:
        self.started = False
        self.pending_ws = ""

    def push(self, text: str) -> str:
        if not self.started:
            text = text.lstrip()
            if not text:
                return ""
            self.started = True
        body = text.rstrip()
        out = self.pending_ws + body if body else ""
        self.pending_ws = text[len(body) :] if body else self.pending_ws + text
        return out


class _HermesStream:
    def __init__(self, parser: HermesParser, make_id: Callable[[int], str]) -> None:
        self._p = parser
        self._make_id = make_id
        self._mode = "text"
        self._buf = ""
        self._seg = _Segment()
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ToolCall] = []
        self._error = False

    def _emit(self, events: list[OutputEvent], text: str) -> None:
        out = self._seg.push(text)
        if not out:
            return
        if self._mode == "think":
            self._reasoning.append(out)
            events.append(ReasoningDelta(out))
        else:
            self._text.append(out)
            events.append(TextDelta(out))

    def _switch(self, mode: str) -> None:
        self._mode = mode
        if mode != "tool":
            self._seg = _Segment() if mode == "think" or not self._text else self._continuation()

    def _continuation(self) -> _Segment:
        # Text after a tool call continues the answer; separate it from earlier text by one newline.
        seg = _Segment()
        seg.pending_ws = "\n"
        return seg

    def feed(self, text: str) -> list[OutputEvent]:
        events: list[OutputEvent] = []
        self._buf += text
        p = self._p
        while self._buf:
            if self._mode == "tool":
                end = self._buf.find(p.tool_close)
                if end < 0:
                    return events
                body, self._buf = self._buf[:end], self._buf[end + len(p.tool_close) :]
                self._tool_body(events, body, closed=True)
                self._switch("text")
                continue
            tags = [p.think_close] if self._mode == "think" else [p.tool_open, p.think_open]
            found = [(self._buf.find(t), t) for t in tags]
            hits = [(i, t) for i, t in found if i >= 0]
            if hits:
                index, tag = min(hits)
                self._emit(events, self._buf[:index])
                self._buf = self._buf[index + len(tag) :]
                self._switch({p.tool_open: "tool", p.think_open: "think"}.get(tag, "text"))
                continue
            keep = _partial_suffix(self._buf, tags)
            cut = len(self._buf) - keep
            self._emit(events, self._buf[:cut])
            self._buf = self._buf[cut:]
            return events
        return events

    def _tool_body(self, events: list[OutputEvent], body: str, *, closed: bool) -> None:
        call = self._p.parse_tool_call(body, self._make_id(len(self._calls)))
        if call is not None:
            self._calls.append(call)
            events.append(ToolCallDone(len(self._calls) - 1, call))
            return
        self._error = True
        raw = self._p.tool_open + body + (self._p.tool_close if closed else "")
        self._mode = "text"
        self._emit(events, raw)

    def finish(self) -> list[OutputEvent]:
        events: list[OutputEvent] = []
        rest, self._buf = self._buf, ""
        if self._mode == "tool":
            self._tool_body(events, rest, closed=False)
        elif rest:
            self._emit(events, rest)
        return events

    def result(self) -> ParsedOutput:
        reasoning = "".join(self._reasoning)
        return ParsedOutput(
            text="".join(self._text),
            reasoning=reasoning or None,
            tool_calls=list(self._calls),
            tool_call_parse_error=self._error,
        )


class HermesParser:
    """Hermes/Qwen format: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` and ``<think>``."""

    name = "hermes"

    def __init__(
        self,
        *,
        tool_open: str = "<tool_call>",
        tool_close: str = "</tool_call>",
        think_open: str = "<think>",
        think_close: str = "</think>",
    ) -> None:
        self.tool_open = tool_open
        self.tool_close = tool_close
        self.think_open = think_open
        self.think_close = think_close

    def stream(self, make_tool_call_id: Callable[[int], str]) -> OutputStream:
        """Start parsing one response."""
        return _HermesStream(self, make_tool_call_id)

    @staticmethod
    def parse_tool_call(body: str, call_id: str) -> ToolCall | None:
        """Parse one tool-call body; None when it is not a valid call."""
        try:
            obj: Any = json.loads(body)
        except (json.JSONDecodeError, RecursionError):
            return None
        if not isinstance(obj, Mapping):
            return None
        name = obj.get("name")
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (json.JSONDecodeError, RecursionError):
                return None
        if not isinstance(name, str) or not name or not isinstance(args, Mapping):
            return None
        return ToolCall(id=call_id, name=name, arguments=dict(args))


def create_parser(name: str) -> OutputParser:
    """Return the output parser called ``name``.

    Raises:
        InvalidArgument: No parser has that name.
    """
    if name == "hermes":
        return HermesParser()
    raise InvalidArgument(f"unknown tool call parser {name!r} (known: hermes)")
