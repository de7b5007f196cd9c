"""OpenAI Responses (Codex's protocol): request translation, JSON answers and the SSE event stream.

The output items live in ``items.py``, the event stream in ``stream.py``.

Codex ``namespace`` tools are flattened into function tools named ``<namespace>__<name>`` (a name that
already starts with the namespace is kept); a call of such a tool is answered with the inner ``name`` plus a
``namespace`` field, and replayed calls carrying ``namespace`` are mapped back. ``custom`` (free-form) tools
are offered as functions with one string parameter ``input`` and answered as ``custom_tool_call`` items.
Reasoning is returned as a ``reasoning`` item (summary text, and ``encrypted_content`` holding the same text
when the harness asks to include it, so a replay carries the exact reasoning back).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import ValidationError

from model_proxy.core.engine import Call
from model_proxy.core.events import CallResult
from model_proxy.core.translation_memo import TranslationMemo
from model_proxy.errors import MalformedRequest
from model_proxy.models import ChatMessage, SamplingParams, ToolCall, ToolSpec
from model_proxy.protocols.base import (
    ErrorInfo,
    ParsedRequest,
    Route,
    list_models,
    malformed,
    sse,
    text_of_parts,
)
from model_proxy.protocols.openai_chat.adapter import openai_error_body, openai_internal_request, parse_arguments
from model_proxy.protocols.openai_responses.items import (
    Context,
    ToolKind,
    call_item,
    message_item,
    reasoning_item,
    response_object,
)
from model_proxy.protocols.openai_responses.models import ResponsesRequest
from model_proxy.protocols.openai_responses.stream import ResponsesStream

__all__ = ["OpenAIResponsesAdapter"]

_TEXT_PARTS = ("text",)
_CUSTOM_SCHEMA = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


def _flat_name(namespace: str, name: str) -> str:
    return name if name.startswith(namespace) else f"{namespace}__{name}"


def _str(item: dict[str, Any], key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise MalformedRequest(f"input item of type {item.get('type', 'message')!r} needs a string {key!r}")
    return value


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return text_of_parts(content, keys=_TEXT_PARTS)
    raise MalformedRequest("message content must be a string or a list of parts")


def _reasoning_text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, list) and content:
        return text_of_parts(content)
    encrypted = item.get("encrypted_content")
    if isinstance(encrypted, str) and encrypted:
        return encrypted
    summary = item.get("summary")
    return text_of_parts(summary) if isinstance(summary, list) else ""


def _tools(raw: list[dict[str, Any]], ignored: list[str]) -> tuple[list[ToolSpec], dict[str, ToolKind]]:
    specs: list[ToolSpec] = []
    kinds: dict[str, ToolKind] = {}

    def add(tool: dict[str, Any], namespace: str | None) -> None:
        kind = tool.get("type", "function")
        name = tool.get("name")
        if kind not in ("function", "custom") or not isinstance(name, str) or not name:
            ignored.append(f"tool {kind}")
            return
        flat = _flat_name(namespace, name) if namespace else name
        params = tool.get("parameters") if kind == "function" else _CUSTOM_SCHEMA
        if not isinstance(params, dict):
            params = {"type": "object", "properties": {}}
        specs.append(ToolSpec(flat, str(tool.get("description") or ""), params))
        kinds[flat] = ToolKind(kind, name, namespace)

    for tool in raw:
        if tool.get("type") == "namespace":
            ns = tool.get("name")
            inner = tool.get("tools")
            if not isinstance(ns, str) or not isinstance(inner, list):
                raise MalformedRequest("namespace tools need a name and a list of tools")
            for sub in inner:
                if isinstance(sub, dict):
                    add(sub, ns)
        else:
            add(tool, None)
    return specs, kinds


def _messages(req: ResponsesRequest, ignored: list[str]) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    if req.instructions:
        out.append(ChatMessage("system", req.instructions))
    items = [{"type": "message", "role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    names: dict[str, str] = {}
    reasoning: str | None = None

    def assistant() -> ChatMessage:
        nonlocal reasoning
        last = out[-1] if out else None
        if last is None or last.role != "assistant":
            last = ChatMessage("assistant")
            out.append(last)
        if reasoning is not None:
            last.reasoning = (last.reasoning or "") + reasoning
            reasoning = None
        return last

    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            text = _content_text(item.get("content"))
            if role in ("system", "developer"):
                out.append(ChatMessage("system", text))
            elif role == "assistant":
                turn = assistant()
                turn.content += text
            elif role == "user":
                out.append(ChatMessage("user", text))
            else:
                raise MalformedRequest(f"unknown message role {role!r}")
        elif kind in ("function_call", "custom_tool_call"):
            call_id = _str(item, "call_id")
            name = _str(item, "name")
            namespace = item.get("namespace")
            if isinstance(namespace, str) and namespace:
                name = _flat_name(namespace, name)
            if kind == "function_call":
                args = parse_arguments(item.get("arguments") or "{}")
            else:
                args = {"input": _str(item, "input")}
            names[call_id] = name
            assistant().tool_calls.append(ToolCall(call_id, name, args))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = _str(item, "call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else _content_text(output)
            out.append(ChatMessage("tool", text, tool_call_id=call_id, name=names.get(call_id)))
        elif kind == "reasoning":
            reasoning = (reasoning or "") + _reasoning_text(item)
        else:
            ignored.append(f"input item {kind}")
    return out


class OpenAIResponsesAdapter:
    """The OpenAI Responses protocol: ``POST .../responses``."""

    protocol = "openai_responses"
    routes: tuple[Route, ...] = (Route(r"/responses$"),)
    header_marks: tuple[str, ...] = ()
    path_marks: tuple[str, ...] = ()

    def list_models(self, names: Sequence[str]) -> dict[str, Any]:
        """The ``GET .../models`` answer (OpenAI's listing)."""
        return list_models(names)

    def parse(
        self,
        body: Any,
        *,
        path_model: str | None = None,
        path_stream: bool = False,
        memo: TranslationMemo | None = None,
    ) -> ParsedRequest:
        """Validate and translate a Responses request."""
        try:
            req = ResponsesRequest.model_validate(body)
        except ValidationError as exc:
            raise malformed(exc) from None
        ignored: list[str] = []
        tools, kinds = _tools(req.tools or [], ignored)
        messages = _messages(req, ignored)
        sampling = SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            max_tokens=req.max_output_tokens,
        )
        internal = openai_internal_request(self.protocol, req, messages, tools, sampling, ignored)
        return ParsedRequest(Context(req, kinds), internal)

    # ----- answers -----------------------------------------------------------------------------------

    def response(self, request: ParsedRequest, result: CallResult) -> dict[str, Any]:
        """The Responses JSON answer."""
        ctx: Context = request.wire
        parsed = result.parsed
        output: list[dict[str, Any]] = []
        if parsed.reasoning:
            output.append(reasoning_item(ctx, f"rs_{result.call_id}", parsed.reasoning))
        if parsed.text or not parsed.tool_calls:
            output.append(message_item(f"msg_{result.call_id}", parsed.text))
        output.extend(call_item(ctx, c) for c in parsed.tool_calls)
        return response_object(ctx, result.call_id, result.model, output, result)

    async def stream(self, request: ParsedRequest, call: Call) -> AsyncIterator[bytes]:
        """The Responses SSE stream (created ... output items ... completed)."""
        async for chunk in ResponsesStream(request.wire, call).events():
            yield chunk

    def error_body(self, error: ErrorInfo) -> dict[str, Any]:
        """OpenAI's error JSON."""
        return openai_error_body(error)

    def stream_error(self, error: ErrorInfo) -> bytes:
        """A ``response.failed`` event carrying the error."""
        body = openai_error_body(error)["error"]
        response = {
            "id": "resp_failed",
            "object": "response",
            "status": "failed",
            "output": [],
            "error": {"code": body["code"] or body["type"], "message": body["message"]},
        }
        return sse({"type": "response.failed", "sequence_number": 0, "response": response}, "response.failed")
