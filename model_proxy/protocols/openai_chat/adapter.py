"""OpenAI Chat Completions: request translation, JSON answers and the SSE chunk stream."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from model_proxy.core.engine import Call
from model_proxy.core.events import CallResult, ReasoningDelta, TextDelta, ToolCallDone
from model_proxy.core.translation_memo import TranslationMemo, reuse_for, translate_new
from model_proxy.errors import MalformedRequest
from model_proxy.models import ChatMessage, InternalRequest, SamplingParams, ToolCall, ToolSpec
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
from model_proxy.protocols.openai_chat.models import ChatMessageIn, ChatRequest

__all__ = ["OpenAIChatAdapter", "openai_error_body", "openai_internal_request", "parse_arguments"]

_FINISH = {"stop": "stop", "tool_calls": "tool_calls", "length": "length", "abort": "stop"}
_ERROR_TYPES = {
    "invalid_request": ("invalid_request_error", None),
    "too_large": ("invalid_request_error", "request_too_large"),
    "context_length": ("invalid_request_error", "context_length_exceeded"),
    "rate_limit": ("requests", "rate_limit_exceeded"),
    "authentication": ("invalid_request_error", "invalid_api_key"),
    "permission": ("invalid_request_error", "permission_denied"),
    "not_found": ("invalid_request_error", "not_found"),
    "conflict": ("invalid_request_error", "conflict"),
    "overloaded": ("server_error", "overloaded"),
    "unavailable": ("server_error", "service_unavailable"),
    "timeout": ("server_error", "timeout"),
    "unimplemented": ("invalid_request_error", "unsupported"),
    "internal": ("server_error", None),
}


def openai_error_body(error: ErrorInfo) -> dict[str, Any]:
    """OpenAI's error JSON (shared by Chat Completions and Responses)."""
    kind, code = _ERROR_TYPES.get(error.kind, ("server_error", None))
    message = error.message
    if error.kind == "context_length":
        message = (
            f"This model's maximum context length is {error.limit} tokens. However, your messages resulted "
            f"in {error.prompt_tokens} tokens. Please reduce the length of the messages."
        )
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def parse_arguments(raw: Any) -> dict[str, Any]:
    """Decode tool-call arguments sent back by a harness (a JSON object, usually as a string)."""
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        raise MalformedRequest("tool call arguments must be a JSON object or a string holding one")
    try:
        value = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError:
        raise MalformedRequest("tool call arguments are not valid JSON") from None
    if not isinstance(value, dict):
        raise MalformedRequest("tool call arguments must be a JSON object")
    return value


def _content(msg: ChatMessageIn, ignored: list[str]) -> str:
    if msg.content is None or isinstance(msg.content, str):
        return msg.content or ""
    for part in msg.content:
        if isinstance(part, dict) and part.get("type") not in (None, "text"):
            ignored.append(f"{msg.role} part {part.get('type')}")
    return text_of_parts(msg.content)


def _translate_message(msg: ChatMessageIn, names: dict[str, str], ignored: list[str]) -> tuple[ChatMessage, ...]:
    """One message's chat message; ``names`` maps the tool call ids seen so far to their tool (and is updated)."""
    text = _content(msg, ignored)
    if msg.role in ("system", "developer"):
        return (ChatMessage("system", text),)
    if msg.role == "assistant":
        calls = []
        for tc in msg.tool_calls or []:
            names[tc.id] = tc.function.name
            calls.append(ToolCall(tc.id, tc.function.name, parse_arguments(tc.function.arguments)))
        reasoning = msg.reasoning_content or msg.reasoning
        return (ChatMessage("assistant", text, tool_calls=calls, reasoning=reasoning or None),)
    if msg.role in ("tool", "function"):
        call_id = msg.tool_call_id or ""
        return (ChatMessage("tool", text, tool_call_id=call_id, name=names.get(call_id, msg.name)),)
    return (ChatMessage("user", text),)


def openai_internal_request(
    protocol: str,
    req: Any,
    messages: list[ChatMessage],
    tools: list[ToolSpec],
    sampling: SamplingParams,
    ignored: list[str],
) -> InternalRequest:
    """The internal request of an OpenAI wire request (``model``, ``stream`` and ``tool_choice`` taken from it).

    A named ``tool_choice`` (an object) is recorded as ``function``; a string as given.
    """
    tool_choice = req.tool_choice if isinstance(req.tool_choice, str) or req.tool_choice is None else "function"
    return internal_request(
        protocol,
        req.model,
        messages,
        tools,
        sampling,
        stream=bool(req.stream),
        ignored=ignored,
        tool_choice=tool_choice,
    )


class OpenAIChatAdapter:
    """The OpenAI Chat Completions protocol: ``POST .../chat/completions``."""

    protocol = "openai_chat"
    routes: tuple[Route, ...] = (Route(r"/chat/completions$"),)
    header_marks: tuple[str, ...] = ()
    path_marks: tuple[str, ...] = ()

    def list_models(self, names: Sequence[str]) -> dict[str, Any]:
        """The ``GET .../models`` answer (a listing Anthropic's SDKs read as well)."""
        return list_models(names)

    def parse(
        self,
        body: Any,
        *,
        path_model: str | None = None,
        path_stream: bool = False,
        memo: TranslationMemo | None = None,
    ) -> ParsedRequest:
        """Validate and translate a Chat Completions request (only the messages new since ``memo``'s last one)."""
        known, reuse = reuse_for(body, memo)
        req = validate_messages(ChatRequest, body, reuse.count)
        if (req.n or 1) > 1:
            raise MalformedRequest("n > 1 is not supported; send one request per sample")
        translated = translate_new(req.messages, reuse, _translate_message)
        messages = translated.messages
        ignored = translated.ignored
        if memo is not None and known is not None:
            memo.remember(known, translated)
        tools: list[ToolSpec] = []
        for tool in req.tools or []:
            if tool.type != "function" or tool.function is None:
                ignored.append(f"tool {tool.type}")
                continue
            fn = tool.function
            tools.append(ToolSpec(fn.name, fn.description or "", fn.parameters or {"type": "object", "properties": {}}))
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        sampling = SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=req.top_k if req.top_k and req.top_k > 0 else -1,
            max_tokens=req.max_completion_tokens or req.max_tokens,
            stop=stop,
            seed=req.seed,
        )
        internal = openai_internal_request(self.protocol, req, messages, tools, sampling, ignored)
        return ParsedRequest(req, internal)

    @staticmethod
    def _usage(result: CallResult) -> dict[str, Any]:
        return {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
        }

    @staticmethod
    def _tool_call(call: ToolCall, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
        }
        if index is not None:
            out = {"index": index, **out}
        return out

    def response(self, request: ParsedRequest, result: CallResult) -> dict[str, Any]:
        """The Chat Completions JSON answer."""
        parsed = result.parsed
        message: dict[str, Any] = {"role": "assistant", "content": parsed.text or None}
        if parsed.reasoning:
            message["reasoning_content"] = parsed.reasoning
        if parsed.tool_calls:
            message["tool_calls"] = [self._tool_call(c) for c in parsed.tool_calls]
        return {
            "id": "chatcmpl-" + result.call_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": result.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": _FINISH.get(result.finish_reason, "stop"),
                    "logprobs": None,
                }
            ],
            "usage": self._usage(result),
        }

    async def stream(self, request: ParsedRequest, call: Call) -> AsyncIterator[bytes]:
        """Chat completion chunks, then ``[DONE]``."""
        wire: ChatRequest = request.wire
        base = {
            "id": "chatcmpl-" + call.call_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": call.request.model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            return sse({**base, "choices": [choice]})

        yield chunk({"role": "assistant", "content": ""})
        async for item in call.events():
            if isinstance(item, TextDelta):
                yield chunk({"content": item.text})
            elif isinstance(item, ReasoningDelta):
                yield chunk({"reasoning_content": item.text})
            elif isinstance(item, ToolCallDone):
                yield chunk({"tool_calls": [self._tool_call(item.call, item.index)]})
            else:
                yield chunk({}, _FINISH.get(item.finish_reason, "stop"))
                if wire.stream_options is not None and wire.stream_options.include_usage:
                    yield sse({**base, "choices": [], "usage": self._usage(item)})
                yield sse("[DONE]")

    def error_body(self, error: ErrorInfo) -> dict[str, Any]:
        """OpenAI's error JSON."""
        return openai_error_body(error)

    def stream_error(self, error: ErrorInfo) -> bytes:
        """An error object as a data event (what OpenAI-compatible servers send mid-stream)."""
        return sse(self.error_body(error))
