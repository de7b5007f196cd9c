"""The provider HTTP front: one Starlette app, protocols told apart by path (any path prefix is accepted).

Routes (``<prefix>`` is anything, e.g. ``/v1`` or ``/anything/v1``):

* ``HEAD /``, ``GET /`` -- liveness (Claude Code's warm-up).
* ``GET <prefix>/models`` -- model listing, in the shape of the protocol the request is attributed to.
* ``POST`` -- the routes each adapter in :data:`model_proxy.protocols.PROTOCOLS` declares
  (:attr:`~model_proxy.protocols.base.ProtocolAdapter.routes`); today ``<prefix>/messages`` (``?beta=true``
  too) and ``<prefix>/messages/count_tokens`` (Anthropic), ``<prefix>/chat/completions`` (OpenAI Chat
  Completions), ``<prefix>/responses`` (OpenAI Responses), ``<prefix>/models/{model}:generateContent`` and
  ``:streamGenerateContent`` (``?alt=sse``; Google). Nothing here is specific to one protocol.

A request is attributed to the adapter whose route matches its path (any method), else to the first adapter
whose path or header marks it carries (Google's ``v1beta``, ``x-goog-api-key``; Anthropic's
``anthropic-version``), else to :data:`~model_proxy.protocols.FALLBACK_PROTOCOL`; its answer or error comes in
that protocol's shape.

The session token is the API key (``x-api-key``, ``Authorization: Bearer``, ``x-goog-api-key`` or ``?key=``);
it is checked before the body is read, and nothing is recorded for a refused call. Every error leaves through
:meth:`ProxyHttp._error` in the caller's provider shape.

Limits (see ``docs/proxy.md``): the body is size-limited while it is read (:mod:`model_proxy.http.body`), must
be strict UTF-8 JSON without lone surrogates, and a session has at most ``max_calls_per_session`` calls in
flight (429 beyond). A body of ``offload_bytes`` or more is decoded, parsed, rendered and tokenised in a worker
thread, so one huge prompt never holds the event loop that serves every other session; except when the call is
the only one the proxy is handling, its body is under 1 MiB and it grew by less than ``offload_bytes`` since the
session's previous call (an agent loop's next turn: the prefix cache makes it a few milliseconds of work). Then
it runs on the loop, which has nothing else to serve, and saves two thread round trips (each one a scheduler
wake-up, milliseconds on a loaded machine).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from typing import Any

from opentelemetry.context import Context
from opentelemetry.propagate import extract
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route as StarletteRoute
from starlette.types import Receive, Scope, Send

from model_proxy.core.engine import Call, ProxyEngine
from model_proxy.core.sessions import Session
from model_proxy.errors import TooManyCalls
from model_proxy.http.body import decode_json, read_body
from model_proxy.http.errors import error_info, retry_headers
from model_proxy.protocols import FALLBACK_PROTOCOL, PROTOCOLS, ParsedRequest, ProtocolAdapter, Route
from polar_core.errors import NotFound
from polar_core.registry import Registry

__all__ = ["ProxyHttp"]

_log = logging.getLogger(__name__)
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_INLINE_MAX_BYTES = 1 << 20
"""Largest body ever prepared on the event loop (decoding alone costs ~3 ms per MiB)."""


class _ReleasingStream(StreamingResponse):
    """An SSE response that frees its call and the session's slot however it ends (done, error, disconnect).

    Starlette does not close a body iterator that a disconnect cancelled (or one that never started), so
    without this the call would keep its gate ticket and the session its slot.
    """

    def __init__(self, content: AsyncGenerator[bytes, None], call: Call, release: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=_SSE_HEADERS)
        self._content = content
        self._call = call
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._content.aclose()
            finally:
                self._call.discard()
                self._release()


class ProxyHttp:
    """Builds and serves the Starlette app over a :class:`ProxyEngine`."""

    def __init__(
        self,
        engine: ProxyEngine,
        *,
        retry_after_s: float,
        max_body_bytes: int,
        model_name: str,
        max_calls_per_session: int = 8,
        offload_bytes: int = 64 * 1024,
        protocols: Registry[Callable[[], ProtocolAdapter]] = PROTOCOLS,
    ) -> None:
        """Create the app.

        Args:
            engine: The call engine.
            retry_after_s: Retry hint of retryable errors when nothing better is known.
            max_body_bytes: Largest accepted request body (413 beyond, counted while reading).
            model_name: Listed by ``GET /v1/models`` besides the session's model.
            max_calls_per_session: Calls one session may have in flight (429 beyond).
            offload_bytes: Bodies at least this large are parsed, rendered and tokenised in a worker thread.
            protocols: The protocols served: each adapter's routes, and nothing else (tests pass their own).
        """
        self.engine = engine
        self._retry_after_s = retry_after_s
        self._max_body = max_body_bytes
        self._model_name = model_name
        self._max_calls = max_calls_per_session
        self._offload = offload_bytes
        self._active = 0  # calls admitted and not yet released, all sessions together
        self.adapters: Mapping[str, ProtocolAdapter] = {name: factory() for name, factory in protocols.items()}
        """Protocol name → its adapter, in registry order."""
        self._routes = tuple((route, adapter) for adapter in self.adapters.values() for route in adapter.routes)
        self._fallback = self.adapters.get(FALLBACK_PROTOCOL) or next(iter(self.adapters.values()))
        self.app = Starlette(routes=[StarletteRoute("/{path:path}", self._dispatch, methods=["GET", "HEAD", "POST"])])

    # ----- dispatch ----------------------------------------------------------------------------------

    async def _dispatch(self, request: Request) -> Response:
        path = request.url.path.rstrip("/") or "/"
        adapter, route, match = self._adapter_for(request, path)
        try:
            if path == "/" and request.method in ("GET", "HEAD"):
                return Response(status_code=200) if request.method == "HEAD" else JSONResponse(self._health())
            if request.method == "GET" and (path.endswith("/models") or "/models/" in path):
                return self._models(request, adapter)
            if request.method != "POST" or route is None or match is None:
                raise NotFound(f"no route for {request.method} {path}")
            if route.count_tokens is not None:
                return await self._count_tokens(request, adapter, route.count_tokens)
            return await self._call(request, adapter, route, match)
        except Exception as exc:
            return self._error(adapter, exc)

    def _health(self) -> dict[str, Any]:
        """``GET /``: ``{"status": "ok"}``, plus what the start had to repair in the stored sessions, if anything."""
        recovery = self.engine.registry.recovery
        if recovery.clean:
            return {"status": "ok"}
        return {
            "status": "ok",
            "repaired_at_start": {
                "corrupt_session_files": len(recovery.corrupt_sessions),
                "sessions_restored_closed": len(recovery.restored_closed),
                "quarantined_record_lines": recovery.quarantined_lines,
                "torn_last_lines": recovery.torn_tails,
            },
        }

    def _adapter_for(self, request: Request, path: str) -> tuple[ProtocolAdapter, Route | None, re.Match[str] | None]:
        """The adapter a request is attributed to, and the route that matched its path (if one did)."""
        for route, adapter in self._routes:
            match = route.match(path)
            if match is not None:
                return adapter, route, match
        for adapter in self.adapters.values():
            if any(mark in path for mark in adapter.path_marks) or any(
                header in request.headers for header in adapter.header_marks
            ):
                return adapter, None, None
        return self._fallback, None, None

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

    def _admit(self, session: Session) -> Callable[[], None]:
        """Take one of the session's call slots; returns the (idempotent) release.

        Raises:
            TooManyCalls: The session has ``max_calls_per_session`` calls in flight already.
        """
        if session.http_calls >= self._max_calls:
            raise TooManyCalls(
                f"this session already has {session.http_calls} calls in flight (the limit is {self._max_calls})",
                retry_after_s=self._retry_after_s,
            )
        session.http_calls += 1
        self._active += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                session.http_calls -= 1
                self._active -= 1

        return release

    async def _parse(
        self,
        request: Request,
        adapter: ProtocolAdapter,
        path_model: str | None = None,
        path_stream: bool = False,
        session: Session | None = None,
    ) -> tuple[ParsedRequest, bool]:
        """Read, decode and validate the body; returns the parsed request and whether to work off the loop."""
        body = await read_body(request, self._max_body)
        large = len(body) >= self._offload
        if session is not None:
            previous, session.last_body_bytes = session.last_body_bytes, len(body)
            if large and self._active <= 1 and previous >= 0 and len(body) < _INLINE_MAX_BYTES:
                large = len(body) - previous >= self._offload  # a next turn of an agent loop, alone: inline

        memo = session.translation_memo(adapter.protocol) if session is not None else None
        body_memo = session.body_memo if memo is not None and session is not None else None

        def parse() -> ParsedRequest:
            value = decode_json(body, body_memo)
            return adapter.parse(value, path_model=path_model, path_stream=path_stream, memo=memo)

        return (await asyncio.to_thread(parse) if large else parse()), large

    # ----- endpoints ---------------------------------------------------------------------------------

    def _models(self, request: Request, adapter: ProtocolAdapter) -> Response:
        session = self._session(request)
        return JSONResponse(adapter.list_models(list(dict.fromkeys([session.meta.model, self._model_name]))))

    async def _count_tokens(
        self, request: Request, adapter: ProtocolAdapter, render: Callable[[int], dict[str, Any]]
    ) -> Response:
        release = self._admit(self._session(request))
        try:
            parsed, large = await self._parse(request, adapter)
            return JSONResponse(render(await self.engine.count_tokens(parsed.internal, offload=large)))
        finally:
            release()

    async def _call(self, request: Request, adapter: ProtocolAdapter, route: Route, match: re.Match[str]) -> Response:
        groups = match.groupdict()
        path_model, path_stream = groups.get("model"), groups.get("stream") is not None
        try:
            session = self._session(request)
            release = self._admit(session)
        except Exception as exc:
            self.engine.metrics.call_failed(adapter.protocol, exc)  # refused: nothing reached the engine
            raise
        streaming = False
        try:
            try:
                parsed, large = await self._parse(request, adapter, path_model, path_stream, session)
            except Exception as exc:
                self.engine.metrics.call_failed(adapter.protocol, exc)
                raise
            parent = _trace_context(session, request)
            call = await self.engine.start_call(session, parsed.internal, trace_context=parent, offload=large)
            sse_query = route.array_unless_query
            if path_stream and sse_query is not None and request.query_params.get(sse_query[0]) != sse_query[1]:
                # Such a stream (Google's without alt=sse) is a JSON array; one element with the whole answer is valid.
                return JSONResponse([adapter.response(parsed, await call.collect())])
            if not parsed.internal.stream or call.was_cut:
                # A call cut by a weight update before its stream began gets a plain retryable status (collect
                # raises GenerationAborted), which every SDK retries by itself.
                return JSONResponse(adapter.response(parsed, await call.collect()))
            streaming = True
            return _ReleasingStream(self._sse(adapter, parsed, call), call, release)
        finally:
            if not streaming:
                release()

    async def _sse(self, adapter: ProtocolAdapter, parsed: ParsedRequest, call: Any) -> AsyncGenerator[bytes, None]:
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
