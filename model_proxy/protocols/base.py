"""What every provider protocol adapter provides, and helpers they share."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Iterable
from typing import Any, Protocol

from pydantic import ValidationError

from model_proxy.core.engine import Call
from model_proxy.core.events import CallResult
from model_proxy.errors import MalformedRequest
from model_proxy.models import ChatMessage, InternalRequest, SamplingParams, ToolSpec

__all__ = [
    "ErrorInfo",
    "ParsedRequest",
    "ProtocolAdapter",
    "internal_request",
    "malformed",
    "sse",
    "text_of_parts",
]


@dataclasses.dataclass(frozen=True, slots=True)
class ErrorInfo:
    """A provider-neutral error about to be rendered in a provider's shape.

    Attributes:
        status: The HTTP status.
        kind: ``invalid_request``, ``too_large``, ``context_length``, ``rate_limit``, ``authentication``,
            ``permission``, ``not_found``, ``conflict``, ``overloaded``, ``unavailable``, ``timeout``,
            ``unimplemented`` or ``internal``.
        message: A sentence for the caller (never a token, never a stack trace).
        retry_after_s: The retry hint, for overload, rate limits and unavailability.
        prompt_tokens: For ``context_length``: the prompt's size.
        limit: For ``context_length``: the model's context.
    """

    status: int
    kind: str
    message: str
    retry_after_s: float | None = None
    prompt_tokens: int = 0
    limit: int = 0


@dataclasses.dataclass(slots=True)
class ParsedRequest:
    """A harness request: the validated wire model and its internal translation."""

    wire: Any
    internal: InternalRequest


class ProtocolAdapter(Protocol):
    """One provider protocol: wire models in, wire answers and SSE events out."""

    protocol: str
    """The completion record's ``protocol`` value."""

    def parse(self, body: Any, *, path_model: str | None, path_stream: bool) -> ParsedRequest:
        """Validate a JSON body and translate it; raises :class:`MalformedRequest`."""
        ...

    def response(self, request: ParsedRequest, result: CallResult) -> dict[str, Any]:
        """The non-streaming JSON answer."""
        ...

    def stream(self, request: ParsedRequest, call: Call) -> AsyncIterator[bytes]:
        """The SSE answer, event by event (errors after the start become the provider's error event)."""
        ...

    def error_body(self, error: ErrorInfo) -> dict[str, Any]:
        """The provider's JSON error object."""
        ...

    def stream_error(self, error: ErrorInfo) -> bytes:
        """The provider's SSE error event, for errors after a stream began."""
        ...


def sse(data: Any, event: str | None = None) -> bytes:
    """Frame one server-sent event (compact JSON never contains a newline, so one ``data:`` line)."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def malformed(exc: ValidationError) -> MalformedRequest:
    """A short, value-free description of a schema error (values may hold secrets or megabytes)."""
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:3]:
        loc = ".".join(str(x) for x in err.get("loc", ())) or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return MalformedRequest("invalid request: " + "; ".join(parts))


def text_of_parts(parts: Iterable[Any], *, keys: tuple[str, ...] = ("text",)) -> str:
    """Join the text of content parts given as strings or objects with a text field."""
    out: list[str] = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, dict):
            for key in keys:
                value = part.get(key)
                if isinstance(value, str):
                    out.append(value)
                    break
        else:
            for key in keys:
                value = getattr(part, key, None)
                if isinstance(value, str):
                    out.append(value)
                    break
    return "".join(out)


def internal_request(
    protocol: str,
    model: str,
    messages: list[ChatMessage],
    tools: list[ToolSpec],
    sampling: SamplingParams,
    *,
    stream: bool,
    ignored: list[str],
    tool_choice: str | None = None,
) -> InternalRequest:
    """The internal request of a translated harness request; ``ignored`` names what was dropped."""
    return InternalRequest(
        protocol=protocol,
        model=model,
        messages=messages,
        tools=tools,
        sampling=sampling,
        stream=stream,
        tool_choice=tool_choice,
        normalized={"ignored": ignored} if ignored else {},
    )
