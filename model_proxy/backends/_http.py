"""Shared plumbing of the HTTP backends (vLLM, SGLang): the client lifecycle, the call, error mapping, SSE.

:class:`HttpBackend` owns everything but the wire format: a subclass names its ``path`` and turns a
:class:`~model_proxy.models.GenerationRequest` into a body, a whole answer into one chunk and a stream of
server-sent events into chunks.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import httpx

from model_proxy.backends.checkpoint import CheckpointInfo, compare_checkpoints, read_checkpoint
from model_proxy.errors import (
    BackendOverloaded,
    BackendTimeout,
    BackendUnavailable,
    ContextLengthExceeded,
    MalformedRequest,
)
from model_proxy.models import GenerationChunk, GenerationRequest
from polar_core.errors import FailedPrecondition, PolarError

__all__ = [
    "HttpBackend",
    "error_from_response",
    "error_from_transport",
    "response_message",
    "retry_after",
    "sse_events",
]

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


def response_message(response: httpx.Response) -> str:
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
    message = response_message(response)
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


class HttpBackend:
    """Base of the backends that call an inference server over HTTP (one ``POST`` per call).

    Attributes:
        name: The backend kind (set by the subclass).
        base_url: The server's root URL.
    """

    name: str
    path: ClassVar[str]
    """The generation endpoint, e.g. ``/v1/completions``."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None,
        timeout_s: float,
        connect_timeout_s: float,
        transport: httpx.AsyncBaseTransport | None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._served_dir: Path | None = None
        """The served checkpoint's directory on the proxy host (an option, discovered, or the last one loaded)."""

    @property
    def _server(self) -> str:
        return f"{self.name} at {self.base_url}"

    async def start(self) -> None:
        """Open the HTTP client; idempotent."""
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.base_url, headers=self._headers, timeout=self._timeout, transport=self._transport
            )

    async def close(self) -> None:
        """Close the HTTP client; idempotent."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def healthy(self) -> bool:
        """Whether ``/health`` answers 200."""
        if self._client is None:
            return False
        try:
            response = await self._client.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    # ----- weight updates (shared by the subclasses' check_weights/load_weights) -----------------------

    def _admin_client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise FailedPrecondition(f"{self._server}: backend not started")
        return self._client

    async def _admin(self, method: str, path: str, *, what: str, **kwargs: Any) -> httpx.Response:
        """One call to a management endpoint; a transport failure is a ``FailedPrecondition`` naming ``what``."""
        try:
            return await self._admin_client().request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise FailedPrecondition(f"{self._server}: {what} failed: {exc!r}") from exc

    async def _discover_model_dir(self, client: httpx.AsyncClient) -> str | None:
        """The served checkpoint's path as the server reports it (``None``: it does not say)."""
        return None

    async def _check_local(self, path: str) -> CheckpointInfo:
        """Validate checkpoint ``path`` against the served one on this host, before anything is sent.

        Raises:
            FailedPrecondition: The served checkpoint is unknown or unreadable here, or ``path`` is missing,
                unreadable or of another architecture, vocabulary, size or tensor layout.
        """
        served_dir = self._served_dir
        if served_dir is None:
            reported = await self._discover_model_dir(self._admin_client())
            if reported is None or not await asyncio.to_thread(Path(reported).is_dir):
                raise FailedPrecondition(
                    f"{self._server}: the served model's directory is unknown on the proxy host "
                    f"(the server reports {reported!r}); set the backend option 'model_dir'"
                )
            served_dir = self._served_dir = Path(reported)
        served = await asyncio.to_thread(read_checkpoint, served_dir)
        candidate = await asyncio.to_thread(read_checkpoint, path)
        problems = compare_checkpoints(served, candidate)
        if problems:
            raise FailedPrecondition(
                f"checkpoint {path!r} does not fit the model {self._server} serves ({served_dir}): "
                + "; ".join(problems)
            )
        return candidate

    async def _body(self, client: httpx.AsyncClient, request: GenerationRequest) -> dict[str, Any]:
        """The JSON body of the call (``client`` lets a subclass ask the server first)."""
        raise NotImplementedError

    def _whole(self, payload: Any) -> GenerationChunk:
        """The one chunk of a non-streaming answer."""
        raise NotImplementedError

    def _stream(self, events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[GenerationChunk]:
        """The chunks of a streaming answer; the call ends at the first one with a finish reason."""
        raise NotImplementedError

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Sample a response.

        Raises:
            BackendUnavailable: The server cannot be reached or failed (5xx, 503 with retry hint).
            BackendOverloaded: 429.
            BackendTimeout: The call ran past the read timeout.
            ContextLengthExceeded: The prompt (and ``max_tokens``) do not fit the model's context.
            MalformedRequest: Other 4xx answers.
        """
        client = self._client
        if client is None:
            raise BackendUnavailable(f"{self._server}: backend not started")
        body = await self._body(client, request)
        try:
            async with client.stream("POST", self.path, json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise error_from_response(
                        response, server=self._server, prompt_tokens=len(request.prompt_token_ids)
                    )
                if not request.stream:
                    await response.aread()
                    yield self._whole(response.json())
                    return
                async for chunk in self._stream(self._events(response)):
                    yield chunk
                    if chunk.finish_reason is not None:
                        return
                raise BackendUnavailable(f"{self._server}: the stream ended without a finish reason")
        except httpx.TransportError as exc:
            raise error_from_transport(exc, server=self._server) from exc

    async def _events(self, response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
        async for event in sse_events(response):
            if "error" in event:
                raise BackendUnavailable(f"{self._server} failed mid-stream: {event['error']}")
            yield event
