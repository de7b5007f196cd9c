"""Google ``generateContent``: request translation, JSON answers and the SSE stream (``alt=sse``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import ValidationError

from model_proxy.core.engine import Call
from model_proxy.core.events import CallResult, ReasoningDelta, TextDelta, ToolCallDone
from model_proxy.core.translation_memo import TranslationMemo
from model_proxy.errors import MalformedRequest
from model_proxy.models import ChatMessage, SamplingParams, ToolCall, ToolSpec
from model_proxy.protocols.base import ErrorInfo, ParsedRequest, Route, internal_request, malformed, sse
from model_proxy.protocols.google.models import Content, GenerateContentRequest

__all__ = ["GoogleAdapter", "lower_schema"]

_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "abort": "STOP"}
_STATUS = {
    "invalid_request": "INVALID_ARGUMENT",
    "too_large": "INVALID_ARGUMENT",
    "context_length": "INVALID_ARGUMENT",
    "rate_limit": "RESOURCE_EXHAUSTED",
    "authentication": "UNAUTHENTICATED",
    "permission": "PERMISSION_DENIED",
    "not_found": "NOT_FOUND",
    "conflict": "FAILED_PRECONDITION",
    "overloaded": "UNAVAILABLE",
    "unavailable": "UNAVAILABLE",
    "timeout": "DEADLINE_EXCEEDED",
    "unimplemented": "UNIMPLEMENTED",
    "internal": "INTERNAL",
}


def lower_schema(schema: Any) -> Any:
    """Turn an OpenAPI-style Gemini schema (``type: "OBJECT"``) into JSON schema (``type: "object"``)."""
    if isinstance(schema, dict):
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key == "type" and isinstance(value, str):
                out[key] = value.lower()
            elif key in ("properties", "$defs", "definitions") and isinstance(value, dict):
                out[key] = {k: lower_schema(v) for k, v in value.items()}
            else:
                out[key] = lower_schema(value)
        return out
    if isinstance(schema, list):
        return [lower_schema(v) for v in schema]
    return schema


def _tool_result_text(response: dict[str, Any] | None) -> str:
    if not response:
        return ""
    if len(response) == 1:
        (value,) = response.values()
        if isinstance(value, str):
            return value
    return json.dumps(response, ensure_ascii=False)


def _system(instruction: Content | str | None) -> str | None:
    if instruction is None:
        return None
    if isinstance(instruction, str):
        return instruction
    return "\n".join(p.text for p in instruction.parts if p.text is not None)


def _messages(req: GenerateContentRequest, ignored: list[str]) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    system = _system(req.system_instruction)
    if system:
        out.append(ChatMessage("system", system))
    pending: dict[str, list[str]] = {}
    for turn_index, content in enumerate(req.contents):
        if content.role == "model":
            msg = ChatMessage("assistant")
            reasoning: list[str] = []
            for i, part in enumerate(content.parts):
                if part.function_call is not None:
                    fc = part.function_call
                    call_id = fc.id or f"call_{turn_index}_{i}"
                    pending.setdefault(fc.name, []).append(call_id)
                    msg.tool_calls.append(ToolCall(call_id, fc.name, dict(fc.args or {})))
                elif part.text is not None and part.thought:
                    reasoning.append(part.text)
                elif part.text is not None:
                    msg.content += part.text
                else:
                    ignored.append("model part")
            msg.reasoning = "".join(reasoning) or None
            out.append(msg)
        elif content.role in (None, "user", "function", "tool"):
            text: list[str] = []
            for part in content.parts:
                if part.function_response is not None:
                    fr = part.function_response
                    if text:
                        out.append(ChatMessage("user", "".join(text)))
                        text = []
                    ids = pending.get(fr.name) or []
                    call_id = fr.id or (ids.pop(0) if ids else fr.name)
                    out.append(ChatMessage("tool", _tool_result_text(fr.response), tool_call_id=call_id, name=fr.name))
                elif part.text is not None:
                    text.append(part.text)
                else:
                    ignored.append("user part")
            if text or not content.parts:
                out.append(ChatMessage("user", "".join(text)))
        else:
            raise MalformedRequest(f"unknown content role {content.role!r}")
    return out


class GoogleAdapter:
    """Google's Generative Language protocol: ``POST .../models/{model}:generateContent`` and ``:streamGenerate...``."""

    protocol = "google_generate"
    routes: tuple[Route, ...] = (
        Route(
            r"/models/(?P<model>[^/:]+):(?:generateContent|(?P<stream>streamGenerateContent))$",
            array_unless_query=("alt", "sse"),
        ),
    )
    header_marks: tuple[str, ...] = ("x-goog-api-key",)
    path_marks: tuple[str, ...] = ("v1beta",)

    def list_models(self, names: Sequence[str]) -> dict[str, Any]:
        """The ``GET .../models`` answer in Google's shape."""
        models = [
            {"name": f"models/{n}", "displayName": n, "supportedGenerationMethods": ["generateContent"]} for n in names
        ]
        return {"models": models}

    def parse(
        self,
        body: Any,
        *,
        path_model: str | None = None,
        path_stream: bool = False,
        memo: TranslationMemo | None = None,
    ) -> ParsedRequest:
        """Validate and translate a generateContent request."""
        try:
            req = GenerateContentRequest.model_validate(body)
        except ValidationError as exc:
            raise malformed(exc) from None
        config = req.generation_config
        if config is not None and (config.candidate_count or 1) > 1:
            raise MalformedRequest("candidateCount > 1 is not supported; send one request per sample")
        ignored: list[str] = []
        tools: list[ToolSpec] = []
        for tool in req.tools or []:
            if tool.function_declarations is None:
                ignored.extend(f"tool {k}" for k in (tool.model_extra or {}))
                continue
            for decl in tool.function_declarations:
                schema = decl.parameters_json_schema
                if schema is None:
                    schema = lower_schema(decl.parameters) if decl.parameters else {"type": "object", "properties": {}}
                tools.append(ToolSpec(decl.name, decl.description or "", schema))
        messages = _messages(req, ignored)
        sampling = SamplingParams(
            temperature=1.0 if config is None or config.temperature is None else config.temperature,
            top_p=1.0 if config is None or config.top_p is None else config.top_p,
            top_k=config.top_k if config is not None and config.top_k and config.top_k > 0 else -1,
            max_tokens=None if config is None else config.max_output_tokens,
            stop=tuple(config.stop_sequences or ()) if config is not None else (),
            seed=None if config is None else config.seed,
        )
        model = path_model or req.model or ""
        internal = internal_request(
            self.protocol, model.removeprefix("models/"), messages, tools, sampling, stream=path_stream, ignored=ignored
        )
        return ParsedRequest(req, internal)

    @staticmethod
    def _usage(result: CallResult) -> dict[str, Any]:
        return {
            "promptTokenCount": result.prompt_tokens,
            "candidatesTokenCount": result.completion_tokens,
            "totalTokenCount": result.prompt_tokens + result.completion_tokens,
        }

    @staticmethod
    def _chunk(call_id: str, model: str, parts: list[dict[str, Any]], finish: str | None = None) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish is not None:
            candidate["finishReason"] = finish
        return {"candidates": [candidate], "modelVersion": model, "responseId": call_id}

    @staticmethod
    def _call_part(call: ToolCall) -> dict[str, Any]:
        return {"functionCall": {"name": call.name, "args": call.arguments, "id": call.id}}

    def response(self, request: ParsedRequest, result: CallResult) -> dict[str, Any]:
        """The generateContent JSON answer."""
        parsed = result.parsed
        parts: list[dict[str, Any]] = []
        if parsed.reasoning:
            parts.append({"text": parsed.reasoning, "thought": True})
        if parsed.text or not parsed.tool_calls:
            parts.append({"text": parsed.text})
        parts.extend(self._call_part(c) for c in parsed.tool_calls)
        body = self._chunk(result.call_id, result.model, parts, _FINISH.get(result.finish_reason, "STOP"))
        body["usageMetadata"] = self._usage(result)
        return body

    async def stream(self, request: ParsedRequest, call: Call) -> AsyncIterator[bytes]:
        """One SSE ``data:`` chunk per delta; the last carries ``finishReason`` and usage."""
        model = call.request.model
        async for item in call.events():
            if isinstance(item, TextDelta):
                yield sse(self._chunk(call.call_id, model, [{"text": item.text}]))
            elif isinstance(item, ReasoningDelta):
                yield sse(self._chunk(call.call_id, model, [{"text": item.text, "thought": True}]))
            elif isinstance(item, ToolCallDone):
                yield sse(self._chunk(call.call_id, model, [self._call_part(item.call)]))
            else:
                body = self._chunk(call.call_id, model, [{"text": ""}], _FINISH.get(item.finish_reason, "STOP"))
                body["usageMetadata"] = self._usage(item)
                yield sse(body)

    def error_body(self, error: ErrorInfo) -> dict[str, Any]:
        """Google's error JSON."""
        status = _STATUS.get(error.kind, "INTERNAL")
        return {"error": {"code": error.status, "message": error.message, "status": status}}

    def stream_error(self, error: ErrorInfo) -> bytes:
        """The error object as a data event."""
        return sse(self.error_body(error))
