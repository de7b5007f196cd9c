"""Client channels with tracing (and the control-plane token) built in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from opentelemetry.instrumentation.grpc import aio_client_interceptors
from opentelemetry.sdk.trace import TracerProvider

from polar_core.auth import bearer_metadata

__all__ = ["open_channel"]


class _TokenClientInterceptor(
    grpc.aio.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.aio.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.aio.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.aio.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds ``authorization: Bearer <token>`` to every call."""

    def __init__(self, token: str) -> None:
        self._metadata = bearer_metadata(token)

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._metadata)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)

    async def intercept_stream_unary(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request_iterator)

    async def intercept_stream_stream(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request_iterator)


def open_channel(
    target: str,
    *,
    tracer_provider: TracerProvider | None = None,
    auth_token: str = "",
    options: Sequence[tuple[str, int | str]] = (),
) -> grpc.aio.Channel:
    """Open an insecure channel to ``target`` that propagates trace context and the control-plane token."""
    interceptors: list[Any] = list(aio_client_interceptors(tracer_provider=tracer_provider))  # type: ignore[no-untyped-call]
    if auth_token:
        interceptors.append(_TokenClientInterceptor(auth_token))
    return grpc.aio.insecure_channel(target, options=list(options), interceptors=interceptors)
