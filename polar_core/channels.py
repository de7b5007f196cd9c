"""Client channels with tracing (and the control-plane token) built in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import grpc
from opentelemetry.instrumentation.grpc import aio_client_interceptors
from opentelemetry.sdk.trace import TracerProvider

from polar_core.auth import bearer_metadata
from polar_core.tls import TlsFiles, client_credentials

__all__ = ["StubPool", "open_channel", "token_interceptors"]


def _with_token(details: grpc.aio.ClientCallDetails, token_metadata: tuple[tuple[str, str], ...]) -> Any:
    metadata = grpc.aio.Metadata(*(details.metadata or ()), *token_metadata)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


# grpc.aio files each interceptor under the FIRST call type it implements (an if/elif chain), so one class
# implementing all four would only ever see unary-unary calls: each call type gets its own class.
class _UnaryUnaryToken(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self._metadata = bearer_metadata(token)

    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(_with_token(details, self._metadata), request)


class _UnaryStreamToken(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self._metadata = bearer_metadata(token)

    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(_with_token(details, self._metadata), request)


class _StreamUnaryToken(grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self._metadata = bearer_metadata(token)

    async def intercept_stream_unary(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(_with_token(details, self._metadata), request_iterator)


class _StreamStreamToken(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self._metadata = bearer_metadata(token)

    async def intercept_stream_stream(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(_with_token(details, self._metadata), request_iterator)


def token_interceptors(token: str) -> list[Any]:
    """Client interceptors adding ``authorization: Bearer <token>`` to calls of every type."""
    return [cls(token) for cls in (_UnaryUnaryToken, _UnaryStreamToken, _StreamUnaryToken, _StreamStreamToken)]


def open_channel(
    target: str,
    *,
    tracer_provider: TracerProvider | None = None,
    auth_token: str = "",
    options: Sequence[tuple[str, int | str]] = (),
    tls: TlsFiles | None = None,
) -> grpc.aio.Channel:
    """Open a channel to ``target`` that propagates trace context, the control-plane token and, with ``tls``, mTLS."""
    interceptors: list[Any] = token_interceptors(auth_token) if auth_token else []
    interceptors.extend(aio_client_interceptors(tracer_provider=tracer_provider))  # type: ignore[no-untyped-call]
    if tls is not None:
        return grpc.aio.secure_channel(
            target, client_credentials(tls), options=list(options), interceptors=interceptors
        )
    return grpc.aio.insecure_channel(target, options=list(options), interceptors=interceptors)


_StubT = TypeVar("_StubT")


class StubPool(Generic[_StubT]):
    """One channel and stub per address, opened on first use with the caller's token, tracing and mTLS files.

    For clients that talk to many peers by address (the rollout server to gateways, proxies and trainers).
    """

    def __init__(
        self,
        make_stub: Callable[[grpc.aio.Channel], _StubT],
        *,
        auth_token: str = "",
        tracer_provider: TracerProvider | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self._make_stub = make_stub
        self._token = auth_token
        self._tracer_provider = tracer_provider
        self._tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, _StubT] = {}

    def stub(self, address: str) -> _StubT:
        """The stub for ``address`` (its channel is opened on first use)."""
        stub = self._stubs.get(address)
        if stub is None:
            channel = open_channel(
                address, tracer_provider=self._tracer_provider, auth_token=self._token, tls=self._tls
            )
            self._channels[address] = channel
            stub = self._stubs[address] = self._make_stub(channel)
        return stub

    async def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()
        self._stubs.clear()
