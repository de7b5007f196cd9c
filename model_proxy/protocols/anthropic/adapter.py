"""Anthropic Messages: request translation, JSON answers and the SSE event stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from model_proxy.core.engine import Call
from model_proxy.core.events import CallResult, OutputEvent, ReasoningDelta, TextDelta, ToolCallDone
from model_proxy.core.translation_memo import TranslationMemo, reuse_for, translate_new
from model_proxy.errors import MalformedRequest
from model_proxy.models import ChatMessage, SamplingParams, ToolCall, ToolSpec
from model_proxy.protocols.anthropic.models import Block, Message, MessagesRequest
from model_proxy.protocols.base import (
    ErrorInfo,
    ParsedRequest,
    Route,
    internal_request,
    list_models,
    sse,
    text_of_parts,
    validate_messages,
)

__all__ = ["AnthropicAdapter"]

_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "abort": "end_turn"}
_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "too_large": "invalid_request_error",  # 413; the SDKs know no request_too_large type
    "context_length": "invalid_request_error",
    "rate_limit": "rate_limit_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "conflict": "invalid_request_error",
    "overloaded": "overloaded_error",
    "unavailable": "api_error",
    "timeout": "api_error",
    "unimplemented": "api_error",
    "internal": "api_error",
}


def _block_text(content: str | list[Block] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return text_of_parts(content)


def _system_messages(req: MessagesRequest) -> list[ChatMessage]:
    if not req.system:
        return []
    system = req.system if isinstance(req.system, str) else "\n".join(b.text or "" for b in req.system)
    return [ChatMessage("system", system)]


def _translate_message(msg: Message, names: dict[str, str], ignored: list[str]) -> tuple[ChatMessage, ...]:
    """One turn's chat messages; ``names`` maps the tool_use ids seen so far to their tool (and is updated)."""
    if isinstance(msg.content, str):  # one text block (a pydantic Block per string turn costs ~1 us each)
        return (ChatMessage(msg.role, msg.content),)
    blocks = msg.content
    if msg.role == "system":
        return (ChatMessage("system", _block_text(blocks)),)
    if msg.role == "assistant":
        turn = ChatMessage("assistant")
        reasoning: list[str] = []
        for block in blocks:
            if block.type == "text":
                turn.content += block.text or ""
            elif block.type == "thinking":
                reasoning.append(block.thinking or "")
            elif block.type == "tool_use":
                if not block.id or not block.name or not isinstance(block.input, dict):
                    raise MalformedRequest("tool_use blocks need id, name and an input object")
                names[block.id] = block.name
                turn.tool_calls.append(ToolCall(block.id, block.name, block.input))
            else:
                ignored.append(f"assistant block {block.type}")
        turn.reasoning = "".join(reasoning) or None
        return (turn,)
    out: list[ChatMessage] = []
    text: list[str] = []
    for block in blocks:
        if block.type == "text":
            text.append(block.text or "")
        elif block.type == "tool_result":
            if text:
                out.append(ChatMessage("user", "".join(text)))
                text = []
            if not block.tool_use_id:
                raise MalformedRequest("tool_result blocks need a tool_use_id")
            out.append(
                ChatMessage(
                    "tool",
                    _block_text(block.content),
                    tool_call_id=block.tool_use_id,
                    name=names.get(block.tool_use_id),
                )
            )
        else:
            ignored.append(f"user block {block.type}")
    if text or not blocks:
        out.append(ChatMessage("user", "".join(text)))
    return tuple(out)


def _usage(result: CallResult) -> dict[str, Any]:
    return {
        "input_tokens": result.prompt_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": result.completion_tokens,
    }


def _stop_reason(result: CallResult) -> str:
    if result.stop_sequence is not None:
        return "stop_sequence"
    return _STOP.get(result.finish_reason, "end_turn")


class _MessagesStream:
    """One call's Messages SSE stream: a content block per text, thinking or tool-use run."""

    def __init__(self, call: Call) -> None:
        self._call = call
        self._index = -1
        self._open_kind: str | None = None

    async def events(self) -> AsyncIterator[bytes]:
        yield self._message_start()
        async for item in self._call.events():
            for chunk in self._on(item):
                yield chunk

    def _message_start(self) -> bytes:
        call = self._call
        message: dict[str, Any] = {
            "id": "msg_" + call.call_id,
            "type": "message",
            "role": "assistant",
            "model": call.request.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": call.prompt_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 0,
            },
        }
        return sse({"type": "message_start", "message": message}, "message_start")

    def _on(self, item: OutputEvent | CallResult) -> list[bytes]:
        if isinstance(item, TextDelta):
            events = self._switch("text", {"type": "text", "text": ""})
            return [*events, self._delta({"type": "text_delta", "text": item.text})]
        if isinstance(item, ReasoningDelta):
            events = self._switch("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            return [*events, self._delta({"type": "thinking_delta", "thinking": item.text})]
        if isinstance(item, ToolCallDone):
            c = item.call
            events = self._stop_open()
            events.append(self._start("tool_use", {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}))
            arguments = json.dumps(c.arguments, ensure_ascii=False)
            events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
            events.append(self._stop())
            return events
        events = [self._start("text", {"type": "text", "text": ""})] if self._index < 0 else []
        events.extend(self._stop_open())
        delta = {"stop_reason": _stop_reason(item), "stop_sequence": item.stop_sequence}
        events.append(sse({"type": "message_delta", "delta": delta, "usage": _usage(item)}, "message_delta"))
        events.append(sse({"type": "message_stop"}, "message_stop"))
        return events

    def _switch(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        if self._open_kind == kind:
            return []
        return [*self._stop_open(), self._start(kind, block)]

    def _start(self, kind: str, block: dict[str, Any]) -> bytes:
        self._index += 1
        self._open_kind = kind
        return sse({"type": "content_block_start", "index": self._index, "content_block": block}, "content_block_start")

    def _stop_open(self) -> list[bytes]:
        return [self._stop()] if self._open_kind is not None else []

    def _stop(self) -> bytes:
        self._open_kind = None
        return sse({"type": "content_block_stop", "index": self._index}, "content_block_stop")

    def _delta(self, body: dict[str, Any]) -> bytes:
        return sse({"type": "content_block_delta", "index": self._index, "delta": body}, "content_block_delta")


def _token_count(tokens: int) -> dict[str, Any]:
    return {"input_tokens": tokens}


class AnthropicAdapter:
    """The Anthropic Messages protocol: ``POST .../messages`` (``?beta=true`` too) and ``.../messages/count_tokens``."""

    protocol = "anthropic_messages"
    routes: tuple[Route, ...] = (Route(r"/messages$"), Route(r"/messages/count_tokens$", count_tokens=_token_count))
    header_marks: tuple[str, ...] = ("anthropic-version",)
    path_marks: tuple[str, ...] = ()

    def list_models(self, names: Sequence[str]) -> dict[str, Any]:
        """The ``GET .../models`` answer (a listing OpenAI's SDKs read as well)."""
        return list_models(names)

    def parse(
        self,
        body: Any,
        *,
        path_model: str | None = None,
        path_stream: bool = False,
        memo: TranslationMemo | None = None,
    ) -> ParsedRequest:
        """Validate and translate a Messages request (only the messages new since ``memo``'s last request)."""
        known, reuse = reuse_for(body, memo)
        req = validate_messages(MessagesRequest, body, reuse.count)
        ignored: list[str] = []
        tools: list[ToolSpec] = []
        for tool in req.tools or []:
            if tool.type not in (None, "custom") or tool.input_schema is None:
                ignored.append(f"tool {tool.name} ({tool.type})")
                continue
            tools.append(ToolSpec(tool.name, tool.description or "", tool.input_schema))
        translated = translate_new(req.messages, reuse, _translate_message)
        messages = _system_messages(req) + translated.messages
        ignored += translated.ignored
        if memo is not None and known is not None:
            memo.remember(known, translated)
        tool_choice = None
        if req.tool_choice is not None:
            tool_choice = req.tool_choice.type if req.tool_choice.type != "tool" else f"tool:{req.tool_choice.name}"
        sampling = SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=-1 if not req.top_k else req.top_k,
            max_tokens=req.max_tokens,
            stop=tuple(req.stop_sequences or ()),
        )
        internal = internal_request(
            self.protocol,
            req.model,
            messages,
            tools,
            sampling,
            stream=req.stream,
            ignored=ignored,
            tool_choice=tool_choice,
        )
        return ParsedRequest(req, internal)

    def response(self, request: ParsedRequest, result: CallResult) -> dict[str, Any]:
        """The Messages JSON answer."""
        parsed = result.parsed
        content: list[dict[str, Any]] = []
        if parsed.reasoning:
            content.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
        if parsed.text or not parsed.tool_calls:
            content.append({"type": "text", "text": parsed.text})
        for call in parsed.tool_calls:
            content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
        return {
            "id": "msg_" + result.call_id,
            "type": "message",
            "role": "assistant",
            "model": result.model,
            "content": content,
            "stop_reason": _stop_reason(result),
            "stop_sequence": result.stop_sequence,
            "usage": _usage(result),
        }

    async def stream(self, request: ParsedRequest, call: Call) -> AsyncIterator[bytes]:
        """The Messages SSE stream: message_start, content blocks, message_delta, message_stop."""
        async for chunk in _MessagesStream(call).events():
            yield chunk

    def error_body(self, error: ErrorInfo) -> dict[str, Any]:
        """Anthropic's error JSON."""
        message = error.message
        if error.kind == "context_length":
            message = f"prompt is too long: {error.prompt_tokens} tokens > {error.limit} maximum"
        return {"type": "error", "error": {"type": _ERROR_TYPES.get(error.kind, "api_error"), "message": message}}

    def stream_error(self, error: ErrorInfo) -> bytes:
        """Anthropic's ``error`` SSE event."""
        return sse(self.error_body(error), "error")
