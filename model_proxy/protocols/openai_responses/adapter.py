"""OpenAI Responses (Codex's protocol): request translation, JSON answers and the SSE event stream.

Codex ``namespace`` tools are flattened into function tools named ``<namespace>__<name>`` (a name that
already starts with the namespace is kept); a call of such a tool is answered with the inner ``name`` plus a
``namespace`` field, and replayed calls carrying ``namespace`` are mapped back. ``custom`` (free-form) tools
are offered as functions with one string parameter ``input`` and answered as ``custom_tool_call`` items.
Reasoning is returned as a ``reasoning`` item (summary text, and ``encrypted_content`` holding the same text
when the harness asks to include it, so a replay carries the exact reasoning back).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError

from model_proxy.core.engine import Call
from model_proxy.core.events import CallResult, ReasoningDelta, TextDelta, ToolCallDone
from model_proxy.errors import MalformedRequest
from model_proxy.models import ChatMessage, InternalRequest, SamplingParams, ToolCall, ToolSpec
from model_proxy.protocols.base import ErrorInfo, ParsedRequest, malformed, sse, text_of_parts
from model_proxy.protocols.openai_chat.adapter import openai_error_body, parse_arguments
from model_proxy.protocols.openai_responses.models import ResponsesRequest

__all__ = ["OpenAIResponsesAdapter"]

_TEXT_PARTS = ("text",)
_CUSTOM_SCHEMA = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


@dataclasses.dataclass(slots=True)
class _ToolKind:
    kind: str  # "function" or "custom"
    name: str  # the name the harness knows
    namespace: str | None = None


@dataclasses.dataclass(slots=True)
class _Context:
    wire: ResponsesRequest
    kinds: dict[str, _ToolKind]


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


def _tools(raw: list[dict[str, Any]], ignored: list[str]) -> tuple[list[ToolSpec], dict[str, _ToolKind]]:
    specs: list[ToolSpec] = []
    kinds: dict[str, _ToolKind] = {}

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
        kinds[flat] = _ToolKind(kind, name, namespace)

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
    """The OpenAI Responses protocol."""

    protocol = "openai_responses"

    def parse(self, body: Any, *, path_model: str | None = None, path_stream: bool = False) -> ParsedRequest:
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
        tool_choice = req.tool_choice if isinstance(req.tool_choice, str) or req.tool_choice is None else "function"
        internal = InternalRequest(
            protocol=self.protocol,
            model=req.model,
            messages=messages,
            tools=tools,
            sampling=sampling,
            stream=bool(req.stream),
            tool_choice=tool_choice,
            normalized={"ignored": ignored} if ignored else {},
        )
        return ParsedRequest(_Context(req, kinds), internal)

    # ----- answers -----------------------------------------------------------------------------------

    @staticmethod
    def _reasoning_item(ctx: _Context, item_id: str, text: str) -> dict[str, Any]:
        item: dict[str, Any] = {
            "type": "reasoning",
            "id": item_id,
            "summary": [{"type": "summary_text", "text": text}] if text else [],
        }
        if "reasoning.encrypted_content" in (ctx.wire.include or []):
            item["encrypted_content"] = text
        return item

    @staticmethod
    def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {
            "type": "message",
            "id": item_id,
            "status": status,
            "role": "assistant",
            "content": [part] if status == "completed" else [],
        }

    @staticmethod
    def _call_item(ctx: _Context, call: ToolCall, status: str = "completed") -> dict[str, Any]:
        kind = ctx.kinds.get(call.name, _ToolKind("function", call.name))
        if kind.kind == "custom":
            value = call.arguments.get("input")
            text = value if isinstance(value, str) else json.dumps(call.arguments, ensure_ascii=False)
            return {
                "type": "custom_tool_call",
                "id": "ctc_" + call.id,
                "call_id": call.id,
                "name": kind.name,
                "input": text if status == "completed" else "",
                "status": status,
            }
        item = {
            "type": "function_call",
            "id": "fc_" + call.id,
            "call_id": call.id,
            "name": kind.name,
            "arguments": json.dumps(call.arguments, ensure_ascii=False) if status == "completed" else "",
            "status": status,
        }
        if kind.namespace:
            item["namespace"] = kind.namespace
        return item

    def _response(
        self, ctx: _Context, call_id: str, model: str, output: list[dict[str, Any]], result: CallResult | None
    ) -> dict[str, Any]:
        status = "in_progress"
        incomplete = None
        usage = None
        if result is not None:
            status = "completed"
            if result.finish_reason == "length":
                status, incomplete = "incomplete", {"reason": "max_output_tokens"}
            usage = {
                "input_tokens": result.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": result.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": result.prompt_tokens + result.completion_tokens,
            }
        wire = ctx.wire
        return {
            "id": "resp_" + call_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "model": model,
            "output": output,
            "usage": usage,
            "incomplete_details": incomplete,
            "error": None,
            "instructions": wire.instructions,
            "tools": wire.tools or [],
            "tool_choice": wire.tool_choice or "auto",
            "parallel_tool_calls": True if wire.parallel_tool_calls is None else wire.parallel_tool_calls,
            "temperature": wire.temperature,
            "top_p": wire.top_p,
            "max_output_tokens": wire.max_output_tokens,
        }

    def response(self, request: ParsedRequest, result: CallResult) -> dict[str, Any]:
        """The Responses JSON answer."""
        ctx: _Context = request.wire
        parsed = result.parsed
        output: list[dict[str, Any]] = []
        if parsed.reasoning:
            output.append(self._reasoning_item(ctx, f"rs_{result.call_id}", parsed.reasoning))
        if parsed.text or not parsed.tool_calls:
            output.append(self._message_item(f"msg_{result.call_id}", parsed.text))
        output.extend(self._call_item(ctx, c) for c in parsed.tool_calls)
        return self._response(ctx, result.call_id, result.model, output, result)

    async def stream(self, request: ParsedRequest, call: Call) -> AsyncIterator[bytes]:
        """The Responses SSE stream (created ... output items ... completed)."""
        ctx: _Context = request.wire
        seq = 0
        output: list[dict[str, Any]] = []
        open_kind: str | None = None
        buffer: list[str] = []

        def event(kind: str, body: dict[str, Any]) -> bytes:
            nonlocal seq
            payload = {"type": kind, "sequence_number": seq, **body}
            seq += 1
            return sse(payload, kind)

        def close() -> list[bytes]:
            nonlocal open_kind
            if open_kind is None:
                return []
            index = len(output)
            text = "".join(buffer)
            buffer.clear()
            events: list[bytes] = []
            if open_kind == "message":
                item_id = f"msg_{call.call_id}_{index}"
                part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                events.append(
                    event(
                        "response.output_text.done",
                        {"item_id": item_id, "output_index": index, "content_index": 0, "text": text, "logprobs": []},
                    )
                )
                events.append(
                    event(
                        "response.content_part.done",
                        {"item_id": item_id, "output_index": index, "content_index": 0, "part": part},
                    )
                )
                item = self._message_item(item_id, text)
            else:
                item_id = f"rs_{call.call_id}_{index}"
                part = {"type": "summary_text", "text": text}
                events.append(
                    event(
                        "response.reasoning_summary_text.done",
                        {"item_id": item_id, "output_index": index, "summary_index": 0, "text": text},
                    )
                )
                events.append(
                    event(
                        "response.reasoning_summary_part.done",
                        {"item_id": item_id, "output_index": index, "summary_index": 0, "part": part},
                    )
                )
                item = self._reasoning_item(ctx, item_id, text)
            events.append(event("response.output_item.done", {"output_index": index, "item": item}))
            output.append(item)
            open_kind = None
            return events

        def open_(kind: str) -> list[bytes]:
            nonlocal open_kind
            events = close() if open_kind not in (None, kind) else []
            if open_kind == kind:
                return events
            open_kind = kind
            index = len(output)
            if kind == "message":
                item_id = f"msg_{call.call_id}_{index}"
                events.append(
                    event(
                        "response.output_item.added",
                        {"output_index": index, "item": self._message_item(item_id, "", "in_progress")},
                    )
                )
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                events.append(
                    event(
                        "response.content_part.added",
                        {"item_id": item_id, "output_index": index, "content_index": 0, "part": part},
                    )
                )
            else:
                item_id = f"rs_{call.call_id}_{index}"
                item = {"type": "reasoning", "id": item_id, "summary": []}
                events.append(event("response.output_item.added", {"output_index": index, "item": item}))
                part = {"type": "summary_text", "text": ""}
                events.append(
                    event(
                        "response.reasoning_summary_part.added",
                        {"item_id": item_id, "output_index": index, "summary_index": 0, "part": part},
                    )
                )
            return events

        model = call.request.model
        yield event("response.created", {"response": self._response(ctx, call.call_id, model, [], None)})
        yield event("response.in_progress", {"response": self._response(ctx, call.call_id, model, [], None)})
        async for item in call.events():
            if isinstance(item, TextDelta | ReasoningDelta):
                kind = "message" if isinstance(item, TextDelta) else "reasoning"
                for chunk in open_(kind):
                    yield chunk
                buffer.append(item.text)
                index = len(output)
                if kind == "message":
                    body = {
                        "item_id": f"msg_{call.call_id}_{index}",
                        "output_index": index,
                        "content_index": 0,
                        "delta": item.text,
                        "logprobs": [],
                    }
                    yield event("response.output_text.delta", body)
                else:
                    body = {
                        "item_id": f"rs_{call.call_id}_{index}",
                        "output_index": index,
                        "summary_index": 0,
                        "delta": item.text,
                    }
                    yield event("response.reasoning_summary_text.delta", body)
            elif isinstance(item, ToolCallDone):
                for chunk in close():
                    yield chunk
                index = len(output)
                done = self._call_item(ctx, item.call)
                yield event(
                    "response.output_item.added",
                    {"output_index": index, "item": self._call_item(ctx, item.call, "in_progress")},
                )
                if done["type"] == "function_call":
                    args = done["arguments"]
                    yield event(
                        "response.function_call_arguments.delta",
                        {"item_id": done["id"], "output_index": index, "delta": args},
                    )
                    yield event(
                        "response.function_call_arguments.done",
                        {"item_id": done["id"], "output_index": index, "arguments": args},
                    )
                else:
                    yield event(
                        "response.custom_tool_call_input.delta",
                        {"item_id": done["id"], "output_index": index, "delta": done["input"]},
                    )
                    yield event(
                        "response.custom_tool_call_input.done",
                        {"item_id": done["id"], "output_index": index, "input": done["input"]},
                    )
                yield event("response.output_item.done", {"output_index": index, "item": done})
                output.append(done)
            else:
                if not output and open_kind is None:
                    for chunk in open_("message"):
                        yield chunk
                for chunk in close():
                    yield chunk
                final = self._response(ctx, call.call_id, model, output, item)
                kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
                yield event(kind, {"response": final})

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
