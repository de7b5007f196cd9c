"""The provider HTTP front: one Starlette app, protocols told apart by path (any path prefix is accepted).

Routes (``<prefix>`` is anything, e.g. ``/v1`` or ``/anything/v1``):

* ``HEAD /``, ``GET /`` -- liveness (Claude Code's warm-up).
* ``POST <prefix>/messages`` (``?beta=true`` too) and ``<prefix>/messages/count_tokens`` -- Anthropic.
* ``POST <prefix>/chat/completions`` -- OpenAI Chat Completions.
* ``POST <prefix>/responses`` -- OpenAI Responses.
* ``POST <prefix>/models/{model}:generateContent`` and ``:streamGenerateContent`` (``?alt=sse``) -- Google.
* ``GET <prefix>/models`` -- model listing (OpenAI/Anthropic shape, or Google's under ``v1beta``).

The session token is the API key (``x-api-key``, ``Authorization: Bearer``, ``x-goog-api-key`` or ``?key=``);
it is checked before the body is read, and nothing is recorded for a refused call. Every error leaves through
:meth:`ProxyHttp._error` in the caller's provider shape.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from opentelemetry.context import Context
from opentelemetry.propagate import extract
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from model_proxy.core.engine import ProxyEngine
from model_proxy.core.sessions import Session
from model_proxy.errors import MalformedRequest
from model_proxy.http.errors import error_info, retry_headers
from model_proxy.protocols import (
    AnthropicAdapter,
    GoogleAdapter,
    OpenAIChatAdapter,
    OpenAIResponsesAdapter,
    ParsedRequest,
    ProtocolAdapter,
)
from polar_core.errors import NotFound

__all__ = ["ProxyHttp"]

_log = logging.getLogger(__name__)
_GOOGLE = re.compile(r"/models/([^/:]+):(generateContent|streamGenerateContent)$")
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError("number out of range")
    return value


class ProxyHttp:
    """Builds and serves the Starlette app over a :class:`ProxyEngine`."""

    def __init__(self, engine: ProxyEngine, *, retry_after_s: float, max_body_bytes: int, model_name: str) -> None:
        self.engine = engine
        self._retry_after_s = retry_after_s
        self._max_body = max_body_bytes
        self._model_name = model_name
        self.anthropic = AnthropicAdapter()
        self.openai_chat = OpenAIChatAdapter()
        self.openai_responses = OpenAIResponsesAdapter()
        self.google = GoogleAdapter()
        self.app = Starlette(routes=[Route("/{path:path}", self._dispatch, methods=["GET", "HEAD", "POST"])])

    # ----- dispatch ----------------------------------------------------------------------------------

    async def _dispatch(self, request: Request) -> Response:
        path = request.url.path.rstrip("/") or "/"
        adapter = self._adapter_for(request, path)
        try:
            if path == "/" and request.method in ("GET", "HEAD"):
                return Response(status_code=200) if request.method == "HEAD" else JSONResponse({"status": "ok"})
            if request.method == "GET" and (path.endswith("/models") or "/models/" in path):
                return self._models(request, adapter, path)
            if request.method != "POST":
                raise NotFound(f"no route for {request.method} {path}")
            if path.endswith("/messages/count_tokens"):
                return await self._count_tokens(request)
            google = _GOOGLE.search(path)
            if google is not None:
                streaming = google.group(2) == "streamGenerateContent"
                return await self._call(request, self.google, google.group(1), streaming)
            if path.endswith(("/messages", "/chat/completions", "/responses")):
                return await self._call(request, adapter, None, False)
            raise NotFound(f"no route for POST {path}")
        except Exception as exc:
            return self._error(adapter, exc)

    def _adapter_for(self, request: Request, path: str) -> ProtocolAdapter:
        if path.endswith(("/messages", "/messages/count_tokens")):
            return self.anthropic
        if path.endswith("/responses"):
            return self.openai_responses
        if path.endswith("/chat/completions"):
            return self.openai_chat
        if "v1beta" in path or _GOOGLE.search(path) or "x-goog-api-key" in request.headers:
            return self.google
        if "anthropic-version" in request.headers:
            return self.anthropic
        return self.openai_chat

    def _error(self, adapter: ProtocolAdapter, exc: Exception) -> Response:
        info = error_info(exc, protocol=adapter.protocol, retry_after_s=self._retry_after_s)
        return JSONResponse(adapter.error_body(info), status_code=info.status, headers=retry_headers(info))

    # ----- helpers -----------------------------------------------------------------------------------

    def _session(self, request: Request) -> Session:
        headers = request.headers
        token = headers.get("x-api-key") or headers.get("x-goog-api-key") or request.query_params.get("key")
        auth = headers.get("authorization")
        if not token and auth:
            scheme, _, value = auth.partition(" ")
            token = value.strip() if scheme.lower() == "bearer" else None
        return self.engine.registry.authenticate(token)

    async def _json(self, request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body:
            raise MalformedRequest(f"request body is larger than {self._max_body} bytes")
        body = await request.body()
        if len(body) > self._max_body:
            raise MalformedRequest(f"request body is larger than {self._max_body} bytes")
        try:
            return json.loads(body, parse_constant=_reject_constant, parse_float=_finite_float)
        except (ValueError, RecursionError):
            raise MalformedRequest("request body is not valid JSON") from None

    # ----- endpoints ---------------------------------------------------------------------------------

    def _models(self, request: Request, adapter: ProtocolAdapter, path: str) -> Response:
        session = self._session(request)
        names = list(dict.fromkeys([session.meta.model, self._model_name]))
        if adapter is self.google:
            models = [
                {"name": f"models/{n}", "displayName": n, "supportedGenerationMethods": ["generateContent"]}
                for n in names
            ]
            return JSONResponse({"models": models})
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
        return JSONResponse(
            {"object": "list", "data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]}
        )

    async def _count_tokens(self, request: Request) -> Response:
        self._session(request)
        parsed = self.anthropic.parse(await self._json(request))
        return JSONResponse({"input_tokens": self.engine.count_tokens(parsed.internal)})

    async def _call(
        self, request: Request, adapter: ProtocolAdapter, path_model: str | None, path_stream: bool
    ) -> Response:
        session = self._session(request)
        parsed = adapter.parse(await self._json(request), path_model=path_model, path_stream=path_stream)
        parent = _trace_context(session, request)
        if adapter is self.google and path_stream and request.query_params.get("alt") != "sse":
            # Without alt=sse Google streams a JSON array; one element holding the whole answer is valid.
            call = await self.engine.start_call(session, parsed.internal, trace_context=parent)
            result = await call.collect()
            return JSONResponse([adapter.response(parsed, result)])
        call = await self.engine.start_call(session, parsed.internal, trace_context=parent)
        if not parsed.internal.stream or call.was_cut:
            # A call cut by a weight update before its stream began gets a plain retryable status (collect
            # raises GenerationAborted), which every SDK retries by itself.
            result = await call.collect()
            return JSONResponse(adapter.response(parsed, result))
        return StreamingResponse(self._sse(adapter, parsed, call), media_type="text/event-stream", headers=_SSE_HEADERS)

    async def _sse(self, adapter: ProtocolAdapter, parsed: ParsedRequest, call: Any) -> AsyncIterator[bytes]:
        try:
            stream: AsyncGenerator[bytes, None] = adapter.stream(parsed, call)  # type: ignore[assignment]
            async with aclosing(stream) as events:
                async for chunk in events:
                    yield chunk
        except Exception as exc:
            info = error_info(exc, protocol=adapter.protocol, retry_after_s=self._retry_after_s)
            yield adapter.stream_error(info)


def _trace_context(session: Session, request: Request) -> Context:
    """The parent of a call's span: the session's trace (from OpenSession), else the harness's ``traceparent``."""
    return session.trace_context or extract(request.headers)
