"""Shared plumbing of the HTTP backends (vLLM, SGLang): the client lifecycle, the call, error mapping, SSE.

:class:`HttpBackend` owns everything but the wire format: a subclass names its ``path`` and turns a
:class:`~model_proxy.models.GenerationRequest` into a body, a whole answer into one chunk and a stream of
server-sent events into chunks.

The hop is one ``aiohttp.ClientSession`` per backend (its pool keeps a keep-alive connection per call in
flight, unbounded in number) and orjson both ways: the body, with its prompt of token IDs, is encoded once,
straight to bytes. Measured in ``bench/proxy_overhead/clients.py``, this costs a fifth of the CPU of an
``httpx.AsyncClient`` per small call and a sixteenth per 35k-ID call (see docs/proxy.md, "Backend hop").
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import orjson

from model_proxy.backends.checkpoint import CheckpointInfo, compare_checkpoints, read_checkpoint, refusal
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
    "HttpAnswer",
    "HttpBackend",
    "TransportError",
    "encode_json",
    "error_from_response",
    "error_from_transport",
    "response_message",
    "retry_after",
    "sse_events",
]

TransportError = (aiohttp.ClientError, TimeoutError)
"""What a call raises when the server cannot be reached or does not answer in time."""

_DEFAULT_RETRY_AFTER_S = 1.0
_KEEPALIVE_S = 4.0
"""Idle keep-alive connections are dropped after this long: below uvicorn's 5 s (vLLM and SGLang serve on
uvicorn), so a request is never sent on a connection the server is closing."""
_JSON_HEADERS = {"Content-Type": "application/json"}
_CONTEXT_HINTS = ("context length", "max_model_len", "context_length", "maximum context", "too long", "longer than")
_LIMIT_PATTERNS = (
    re.compile(r"maximum (?:model |context )?(?:context )?length is (\d+)"),
    re.compile(r"context length \((\d+) tokens?\)"),
    re.compile(r"context length of (\d+)"),
    re.compile(r"max_model_len[^\d]{0,20}(\d+)"),
)


def encode_json(body: Any) -> bytes:
    """``body`` as JSON bytes (orjson; tuples are arrays, non-string keys become strings)."""
    return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)


@dataclasses.dataclass(frozen=True, slots=True)
class HttpAnswer:
    """A whole HTTP response: status, headers and body.

    Attributes:
        status_code: The HTTP status.
        headers: The response headers (case-insensitive look-up).
        content: The body.
    """

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        """The body as text (undecodable bytes replaced)."""
        return self.content.decode(errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON.

        Raises:
            ValueError: The body is not JSON.
        """
        return orjson.loads(self.content)


async def _answer(response: aiohttp.ClientResponse) -> HttpAnswer:
    return HttpAnswer(response.status, response.headers, await response.read())


def retry_after(response: HttpAnswer) -> float:
    """Return the ``Retry-After`` header in seconds, or a default of one second."""
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return _DEFAULT_RETRY_AFTER_S


def response_message(response: HttpAnswer) -> str:
    """The error message of a response: ``error.message``, ``error``, ``message`` or ``detail``, else the body."""
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
    return orjson.dumps(body).decode()[:500]


def error_from_response(response: HttpAnswer, *, server: str, prompt_tokens: int) -> PolarError:
    """Map a non-2xx response of an inference server to a proxy error.

    Args:
        response: The response.
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


def error_from_transport(exc: aiohttp.ClientError | TimeoutError, *, server: str) -> PolarError:
    """Map a transport failure: no connection to ``BackendUnavailable``, no answer in time to ``BackendTimeout``."""
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        return BackendUnavailable(f"{server} cannot be reached: {exc!r}", retry_after_s=_DEFAULT_RETRY_AFTER_S)
    if isinstance(exc, TimeoutError):
        return BackendTimeout(f"{server} did not answer in time: {exc!r}")
    return BackendUnavailable(f"{server} failed: {exc!r}", retry_after_s=_DEFAULT_RETRY_AFTER_S)


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The lines of a byte stream, without their ``\\n`` or ``\\r\\n``, of any length."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        if b"\n" not in chunk:
            continue
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.removesuffix(b"\r")
    if pending:
        yield pending.removesuffix(b"\r")


async def sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """Yield the JSON objects of a server-sent-event stream (its bytes, in chunks), stopping at ``[DONE]``.

    Raises:
        BackendUnavailable: An event is not valid JSON.
    """
    data: list[bytes] = []
    async for line in _lines(chunks):
        if line.startswith(b"data:"):
            data.append(line[5:].strip())
            continue
        if line.strip() or not data:
            continue
        payload = b"\n".join(data)
        data = []
        if payload == b"[DONE]":
            return
        try:
            event = orjson.loads(payload)
        except ValueError as exc:
            raise BackendUnavailable(f"malformed server-sent event: {payload[:200]!r}") from exc
        if isinstance(event, dict):
            yield event
    if data and data != [b"[DONE]"]:
        event = orjson.loads(b"\n".join(data))
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

    def __init__(self, base_url: str, *, api_key: str | None, timeout_s: float, connect_timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # sock_read bounds each wait for the server's next bytes (a call may stream for longer in all).
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._served_dir: Path | None = None
        self._served: CheckpointInfo | None = None  # the served checkpoint's headers, once read
        self._checked: CheckpointInfo | None = None  # the last checkpoint that passed the check
        """The served checkpoint's directory on the proxy host (an option, discovered, or the last one loaded)."""

    @property
    def _server(self) -> str:
        return f"{self.name} at {self.base_url}"

    async def start(self) -> None:
        """Open the HTTP client (a connection pool); idempotent."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=_KEEPALIVE_S)
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=self._timeout, connector=connector, auto_decompress=False
            )

    async def close(self) -> None:
        """Close the HTTP client; idempotent."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> HttpAnswer:
        """One whole request to ``path`` (raises ``BackendUnavailable`` before :meth:`start`).

        Raises:
            aiohttp.ClientError, TimeoutError: The server cannot be reached or did not answer in time.
        """
        session = self._session
        if session is None:
            raise BackendUnavailable(f"{self._server}: backend not started")
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s is not None else self._timeout
        data, headers = (encode_json(json), _JSON_HEADERS) if json is not None else (None, None)
        async with session.request(
            method, self.base_url + path, data=data, headers=headers, params=params, timeout=timeout
        ) as response:
            return await _answer(response)

    async def healthy(self) -> bool:
        """Whether ``/health`` answers 200."""
        if self._session is None:
            return False
        try:
            response = await self._request("GET", "/health", timeout_s=5.0)
        except TransportError:
            return False
        return response.status_code == 200

    # ----- weight updates (shared by the subclasses' check_weights/load_weights) -----------------------

    async def _admin(self, method: str, path: str, *, what: str, **kwargs: Any) -> HttpAnswer:
        """One call to a management endpoint; a transport failure is a ``FailedPrecondition`` naming ``what``."""
        if self._session is None:
            raise FailedPrecondition(f"{self._server}: backend not started")
        try:
            return await self._request(method, path, **kwargs)
        except TransportError as exc:
            raise FailedPrecondition(f"{self._server}: {what} failed: {exc!r}") from exc

    async def _discover_model_dir(self) -> str | None:
        """The served checkpoint's path as the server reports it (``None``: it does not say)."""
        return None

    async def _check_local(self, path: str) -> CheckpointInfo:
        """Validate checkpoint ``path`` against the served one on this host, before anything is sent.

        Raises:
            FailedPrecondition: The served checkpoint is unknown or unreadable here, or ``path`` is missing,
                unreadable, or of another architecture or size, or its tensors' names, shapes or dtypes differ
                from the served checkpoint's (each one named, see :mod:`model_proxy.backends.checkpoint`).
        """
        served_dir = self._served_dir
        if self._served is not None and self._served.path == served_dir:
            served = self._served
        elif served_dir is None:
            reported = await self._discover_model_dir()
            if reported is None or not await asyncio.to_thread(Path(reported).is_dir):
                raise FailedPrecondition(
                    f"{self._server}: the served model's directory is unknown on the proxy host "
                    f"(the server reports {reported!r}); set the backend option 'model_dir'"
                )
            served_dir = self._served_dir = Path(reported)
            served = self._served = await asyncio.to_thread(read_checkpoint, served_dir)
        else:
            served = self._served = await asyncio.to_thread(read_checkpoint, served_dir)
        candidate = await asyncio.to_thread(read_checkpoint, path)
        problems = compare_checkpoints(served, candidate)
        if problems:
            raise refusal(path, f"the model {self._server} serves ({served_dir})", problems)
        self._checked = candidate
        return candidate

    def _now_serving(self, path: str) -> None:
        """Record that the server loaded checkpoint ``path``: later checks compare with its headers.

        The headers read by the check are kept, so a trainer may delete an old checkpoint directory once the
        fleet has moved on.
        """
        self._served_dir = Path(path)
        checked = self._checked
        self._served = checked if checked is not None and checked.path == self._served_dir else None

    async def _body(self, request: GenerationRequest) -> dict[str, Any]:
        """The JSON body of the call (a subclass may ask the server first, through :meth:`_request`)."""
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
        session = self._session
        if session is None:
            raise BackendUnavailable(f"{self._server}: backend not started")
        try:
            body = encode_json(await self._body(request))
            async with session.post(self.base_url + self.path, data=body, headers=_JSON_HEADERS) as response:
                if response.status != 200:
                    raise error_from_response(
                        await _answer(response), server=self._server, prompt_tokens=len(request.prompt_token_ids)
                    )
                if not request.stream:
                    yield self._whole(orjson.loads(await response.read()))
                    return
                async for chunk in self._stream(self._events(response)):
                    yield chunk
                    if chunk.finish_reason is not None:
                        return
                raise BackendUnavailable(f"{self._server}: the stream ended without a finish reason")
        except TransportError as exc:
            raise error_from_transport(exc, server=self._server) from exc

    async def _events(self, response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
        async for event in sse_events(response.content.iter_any()):
            if "error" in event:
                raise BackendUnavailable(f"{self._server} failed mid-stream: {event['error']}")
            yield event
