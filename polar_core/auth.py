"""Control-plane authentication: a shared bearer token on every gRPC call.

Health checks and reflection stay open so orchestrators can probe a server without the secret. The token is
compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

__all__ = ["AUTH_METADATA_KEY", "TokenAuthInterceptor", "bearer_metadata"]

AUTH_METADATA_KEY = "authorization"
_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Return call metadata that authenticates with ``token`` (empty when no token is configured)."""
    return ((AUTH_METADATA_KEY, f"Bearer {token}"),) if token else ()


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Refuses calls whose ``authorization`` metadata is not ``Bearer <token>`` with UNAUTHENTICATED."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = handler_call_details.method or ""
        if method.startswith(_OPEN_PREFIXES):
            return await continuation(handler_call_details)
        presented = ""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == AUTH_METADATA_KEY:
                presented = value if isinstance(value, str) else value.decode()
        if not hmac.compare_digest(presented.encode(), self._expected):
            handler = await continuation(handler_call_details)
            if handler is None:
                return handler
            return _deny_like(handler, "missing or wrong control-plane token")
        return await continuation(handler_call_details)


def _deny_like(handler: grpc.RpcMethodHandler[Any, Any], message: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A denying handler with the same streaming shape and serializers as ``handler``."""

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def streaming(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield None  # pragma: no cover - abort raises

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary, **kwargs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming, **kwargs)
    return grpc.stream_stream_rpc_method_handler(streaming, **kwargs)
