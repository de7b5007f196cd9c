"""What every provider protocol adapter provides, and helpers they share.

An adapter declares its own HTTP endpoints (:attr:`ProtocolAdapter.routes`) and the request marks that
attribute other requests to it (:attr:`ProtocolAdapter.header_marks`, :attr:`ProtocolAdapter.path_marks`);
``model_proxy.http.app`` builds its dispatch from the registered adapters (``model_proxy.protocols.PROTOCOLS``)
and holds no per-protocol routing.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from model_proxy.core.engine import Call
from model_proxy.core.events import CallResult
from model_proxy.core.translation_memo import TranslationMemo
from model_proxy.errors import MalformedRequest
from model_proxy.models import ChatMessage, InternalRequest, SamplingParams, ToolSpec

__all__ = [
    "ErrorInfo",
    "ParsedRequest",
    "ProtocolAdapter",
    "Route",
    "internal_request",
    "list_models",
    "malformed",
    "sse",
    "text_of_parts",
    "validate_messages",
]

_Wire = TypeVar("_Wire", bound=BaseModel)


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


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    """One ``POST`` endpoint of a protocol, matched against the end of the request path (any prefix is accepted).

    Attributes:
        pattern: A regular expression searched in the path (anchor it with ``$``). A named group ``model``
            gives the model the path names (Google's ``models/{model}:generateContent``); a named group
            ``stream`` that matched means the path asks for a stream.
        count_tokens: When set, the endpoint counts the prompt's tokens instead of sampling, and this renders
            the count as the protocol's JSON answer (Anthropic's ``messages/count_tokens``).
        array_unless_query: For a streaming path: unless the query has this ``(key, value)``, the stream is
            answered as a JSON array holding the one complete answer (Google streams SSE only with
            ``alt=sse``).
    """

    pattern: str
    count_tokens: Callable[[int], dict[str, Any]] | None = None
    array_unless_query: tuple[str, str] | None = None

    def match(self, path: str) -> re.Match[str] | None:
        """The match of :attr:`pattern` in ``path``, if any."""
        return re.search(self.pattern, path)


class ProtocolAdapter(Protocol):
    """One provider protocol: its endpoints, wire models in, wire answers and SSE events out."""

    protocol: str
    """The completion record's ``protocol`` value, and the adapter's name in ``model_proxy.protocols.PROTOCOLS``."""

    routes: tuple[Route, ...]
    """The ``POST`` endpoints this protocol answers."""

    header_marks: tuple[str, ...]
    """Request headers only this protocol's clients send. They attribute a request no route matched (``GET
    .../models``, an unknown path) to this protocol, so its answer or error comes in this protocol's shape; the
    first adapter in registry order with a matching mark wins; without any, the request is answered in the shape
    of ``model_proxy.protocols.FALLBACK_PROTOCOL`` (``openai_chat``)."""

    path_marks: tuple[str, ...]
    """Path substrings that do the same as :attr:`header_marks` (Google's ``v1beta``)."""

    def list_models(self, names: Sequence[str]) -> dict[str, Any]:
        """The ``GET .../models`` answer listing ``names``."""
        ...

    def parse(
        self, body: Any, *, path_model: str | None, path_stream: bool, memo: TranslationMemo | None = None
    ) -> ParsedRequest:
        """Validate a JSON body and translate it; raises :class:`MalformedRequest`.

        ``memo`` is the calling session's memory of its last request of this protocol: an adapter may validate
        and translate only the messages that changed since (see :mod:`model_proxy.core.translation_memo`); the
        result is the same as without it. The wire model then holds only the messages it validated.
        """
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


def list_models(names: Sequence[str]) -> dict[str, Any]:
    """A model listing that both OpenAI's and Anthropic's SDKs read (the union of their fields)."""
    data = [
        {
            "id": n,
            "object": "model",
            "type": "model",
            "created": 0,
            "created_at": "1970-01-01T00:00:00Z",
            "owned_by": "polar",
            "display_name": n,
        }
        for n in names
    ]
    return {"object": "list", "data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]}


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


def validate_messages(model: type[_Wire], body: Any, reused: int) -> _Wire:
    """Validate ``body`` as ``model``, with only the messages after the first ``reused`` (validated before).

    An error is reported at its index in the whole request.

    Raises:
        MalformedRequest: The body does not validate.
    """
    raw = body["messages"] if reused else None
    try:
        return model.model_validate({**body, "messages": raw[reused:]} if raw else body)
    except ValidationError as exc:
        error = exc
    if raw:
        try:
            model.model_validate(body)
        except ValidationError as exc:
            error = exc
    raise malformed(error) from None


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
