"""Shared plumbing of the HTTP backends (vLLM, SGLang): error mapping and server-sent events."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx

from model_proxy.errors import (
    BackendOverloaded,
    BackendTimeout,
    BackendUnavailable,
    ContextLengthExceeded,
    MalformedRequest,
)
from polar_core.errors import PolarError

__all__ = ["error_from_response", "error_from_transport", "retry_after", "sse_events"]

_DEFAULT_RETRY_AFTER_S = 1.0
_CONTEXT_HINTS = ("context length", "max_model_len", "context_length", "maximum context", "too long", "longer than")
_LIMIT_PATTERNS = (
    re.compile(r"maximum (?:model |context )?(?:context )?length is (\d+)"),
    re.compile(r"context length \((\d+) tokens?\)"),
    re.compile(r"context length of (\d+)"),
    re.compile(r"max_model_len[^\d]{0,20}(\d+)"),
)


def retry_after(response: httpx.Response) -> float:
    """Return the ``Retry-After`` header in seconds, or a default of one second."""
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return _DEFAULT_RETRY_AFTER_S


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if isinstance(error, str):
            return error
        if "message" in body:
            return str(body["message"])
        if "detail" in body:
            return str(body["detail"])
    return json.dumps(body)[:500]


def error_from_response(response: httpx.Response, *, server: str, prompt_tokens: int) -> PolarError:
    """Map a non-2xx response of an inference server to a proxy error.

    Args:
        response: The response (its body already read).
        server: Name and URL of the server, for the message.
        prompt_tokens: Length of the prompt, reported by ``ContextLengthExceeded``.

    Returns:
        ``BackendOverloaded`` (429), ``BackendUnavailable`` (503, 5xx, 404: model not served),
        ``ContextLengthExceeded`` (400 naming the context length) or ``MalformedRequest`` (other 4xx).
    """
    message = _message(response)
    text = f"{server} answered {response.status_code}: {message}"
    status = response.status_code
    if status == 429:
        return BackendOverloaded(text, retry_after_s=retry_after(response))
    if status in (400, 413, 422) and any(hint in message.lower() for hint in _CONTEXT_HINTS):
        for pattern in _LIMIT_PATTERNS:
            match = pattern.search(message)
            if match:
                return ContextLengthExceeded(prompt_tokens, int(match.group(1)))
        return ContextLengthExceeded(prompt_tokens, 0)
    if status == 404 or status >= 500:
        return BackendUnavailable(text, retry_after_s=retry_after(response))
    if status == 408:
        return BackendTimeout(text)
    return MalformedRequest(text)


def error_from_transport(exc: httpx.TransportError, *, server: str) -> PolarError:
    """Map an httpx transport failure: timeouts to ``BackendTimeout``, the rest to ``BackendUnavailable``."""
    if isinstance(exc, httpx.ConnectTimeout | httpx.ConnectError | httpx.PoolTimeout):
        return BackendUnavailable(f"{server} cannot be reached: {exc!r}", retry_after_s=_DEFAULT_RETRY_AFTER_S)
    if isinstance(exc, httpx.TimeoutException):
        return BackendTimeout(f"{server} did not answer in time: {exc!r}")
    return BackendUnavailable(f"{server} failed: {exc!r}", retry_after_s=_DEFAULT_RETRY_AFTER_S)


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Yield the JSON objects of a server-sent-event stream, stopping at ``[DONE]``.

    Raises:
        BackendUnavailable: An event is not valid JSON.
    """
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].strip())
            continue
        if line.strip() or not data:
            continue
        payload = "\n".join(data)
        data = []
        if payload == "[DONE]":
            return
        try:
            event = json.loads(payload)
        except ValueError as exc:
            raise BackendUnavailable(f"malformed server-sent event: {payload[:200]!r}") from exc
        if isinstance(event, dict):
            yield event
    if data and data != ["[DONE]"]:
        event = json.loads("\n".join(data))
        if isinstance(event, dict):
            yield event
