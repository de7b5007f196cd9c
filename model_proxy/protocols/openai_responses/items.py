"""The Responses output items and response object, shared by the JSON answer and the SSE stream."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from model_proxy.core.events import CallResult
from model_proxy.models import ToolCall
from model_proxy.protocols.openai_responses.models import ResponsesRequest

__all__ = ["Context", "ToolKind", "call_item", "message_item", "reasoning_item", "response_object"]


@dataclasses.dataclass(slots=True)
class ToolKind:
    """How the harness knows a tool the model sees under a flat name."""

    kind: str  # "function" or "custom"
    name: str  # the name the harness knows
    namespace: str | None = None


@dataclasses.dataclass(slots=True)
class Context:
    """What answering a request needs of it: the wire request and its tools' kinds by flat name."""

    wire: ResponsesRequest
    kinds: dict[str, ToolKind]


def reasoning_item(ctx: Context, item_id: str, text: str) -> dict[str, Any]:
    """A ``reasoning`` item (with ``encrypted_content`` when the request includes it)."""
    item: dict[str, Any] = {
        "type": "reasoning",
        "id": item_id,
        "summary": [{"type": "summary_text", "text": text}] if text else [],
    }
    if "reasoning.encrypted_content" in (ctx.wire.include or []):
        item["encrypted_content"] = text
    return item


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """An assistant ``message`` item (no content while in progress)."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [part] if status == "completed" else [],
    }


def call_item(ctx: Context, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    """A ``function_call`` or ``custom_tool_call`` item, named as the harness knows the tool."""
    kind = ctx.kinds.get(call.name, ToolKind("function", call.name))
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


def response_object(
    ctx: Context, call_id: str, model: str, output: list[dict[str, Any]], result: CallResult | None
) -> dict[str, Any]:
    """The ``response`` object: in progress until ``result`` is given."""
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
