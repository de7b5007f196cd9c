"""The Responses SSE stream of one call: created, in progress, output items as they form, completed.

Text and reasoning deltas open an output item (a message or a reasoning summary) and stream into it; a
change of kind, a tool call or the end closes it. Every event carries the next ``sequence_number``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from model_proxy.core.engine import Call
from model_proxy.core.events import CallResult, OutputEvent, ReasoningDelta, TextDelta, ToolCallDone
from model_proxy.models import ToolCall
from model_proxy.protocols.base import sse
from model_proxy.protocols.openai_responses.items import (
    Context,
    call_item,
    message_item,
    reasoning_item,
    response_object,
)

__all__ = ["ResponsesStream"]

_MESSAGE = "message"
_REASONING = "reasoning"


class ResponsesStream:
    """Turns one call's output events into Responses server-sent events."""

    def __init__(self, ctx: Context, call: Call) -> None:
        self._ctx = ctx
        self._call = call
        self._seq = 0
        self._output: list[dict[str, Any]] = []
        self._open_kind: str | None = None
        self._buffer: list[str] = []

    async def events(self) -> AsyncIterator[bytes]:
        """The whole stream."""
        yield self._event("response.created", {"response": self._response(None)})
        yield self._event("response.in_progress", {"response": self._response(None)})
        async for item in self._call.events():
            for chunk in self._on(item):
                yield chunk

    def _on(self, item: OutputEvent | CallResult) -> list[bytes]:
        if isinstance(item, TextDelta):
            return self._delta(_MESSAGE, item.text)
        if isinstance(item, ReasoningDelta):
            return self._delta(_REASONING, item.text)
        if isinstance(item, ToolCallDone):
            return self._tool_call(item.call)
        return self._finish(item)

    def _event(self, kind: str, body: dict[str, Any]) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **body}
        self._seq += 1
        return sse(payload, kind)

    def _response(self, result: CallResult | None) -> dict[str, Any]:
        call = self._call
        output = self._output if result is not None else []
        return response_object(self._ctx, call.call_id, call.request.model, output, result)

    def _item_id(self, kind: str, index: int) -> str:
        prefix = "msg" if kind == _MESSAGE else "rs"
        return f"{prefix}_{self._call.call_id}_{index}"

    def _delta(self, kind: str, text: str) -> list[bytes]:
        events = self._open(kind)
        self._buffer.append(text)
        index = len(self._output)
        where = {"item_id": self._item_id(kind, index), "output_index": index}
        if kind == _MESSAGE:
            body = {**where, "content_index": 0, "delta": text, "logprobs": []}
            events.append(self._event("response.output_text.delta", body))
        else:
            body = {**where, "summary_index": 0, "delta": text}
            events.append(self._event("response.reasoning_summary_text.delta", body))
        return events

    def _open(self, kind: str) -> list[bytes]:
        if self._open_kind == kind:
            return []
        events = self._close()
        self._open_kind = kind
        index = len(self._output)
        item_id = self._item_id(kind, index)
        where = {"item_id": item_id, "output_index": index}
        if kind == _MESSAGE:
            item = message_item(item_id, "", "in_progress")
            events.append(self._event("response.output_item.added", {"output_index": index, "item": item}))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append(self._event("response.content_part.added", {**where, "content_index": 0, "part": part}))
        else:
            item = {"type": "reasoning", "id": item_id, "summary": []}
            events.append(self._event("response.output_item.added", {"output_index": index, "item": item}))
            part = {"type": "summary_text", "text": ""}
            events.append(
                self._event("response.reasoning_summary_part.added", {**where, "summary_index": 0, "part": part})
            )
        return events

    def _close(self) -> list[bytes]:
        kind = self._open_kind
        if kind is None:
            return []
        index = len(self._output)
        text = "".join(self._buffer)
        self._buffer.clear()
        item_id = self._item_id(kind, index)
        where = {"item_id": item_id, "output_index": index}
        events: list[bytes] = []
        if kind == _MESSAGE:
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            done = {**where, "content_index": 0, "text": text, "logprobs": []}
            events.append(self._event("response.output_text.done", done))
            events.append(self._event("response.content_part.done", {**where, "content_index": 0, "part": part}))
            item = message_item(item_id, text)
        else:
            part = {"type": "summary_text", "text": text}
            done = {**where, "summary_index": 0, "text": text}
            events.append(self._event("response.reasoning_summary_text.done", done))
            events.append(
                self._event("response.reasoning_summary_part.done", {**where, "summary_index": 0, "part": part})
            )
            item = reasoning_item(self._ctx, item_id, text)
        events.append(self._event("response.output_item.done", {"output_index": index, "item": item}))
        self._output.append(item)
        self._open_kind = None
        return events

    def _tool_call(self, call: ToolCall) -> list[bytes]:
        events = self._close()
        index = len(self._output)
        done = call_item(self._ctx, call)
        added = call_item(self._ctx, call, "in_progress")
        events.append(self._event("response.output_item.added", {"output_index": index, "item": added}))
        where = {"item_id": done["id"], "output_index": index}
        if done["type"] == "function_call":
            args = done["arguments"]
            events.append(self._event("response.function_call_arguments.delta", {**where, "delta": args}))
            events.append(self._event("response.function_call_arguments.done", {**where, "arguments": args}))
        else:
            text = done["input"]
            events.append(self._event("response.custom_tool_call_input.delta", {**where, "delta": text}))
            events.append(self._event("response.custom_tool_call_input.done", {**where, "input": text}))
        events.append(self._event("response.output_item.done", {"output_index": index, "item": done}))
        self._output.append(done)
        return events

    def _finish(self, result: CallResult) -> list[bytes]:
        events = self._open(_MESSAGE) if not self._output and self._open_kind is None else []
        events.extend(self._close())
        final = self._response(result)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        events.append(self._event(kind, {"response": final}))
        return events
