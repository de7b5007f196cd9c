"""The one place that maps :mod:`polar_core.errors` exceptions to gRPC status codes.

Servicers raise; this interceptor turns a :class:`~polar_core.errors.PolarError` into its status code with a
``google.rpc.Status`` in the ``grpc-status-details-bin`` trailer carrying ``ErrorInfo`` (reason, domain
``polar.dev``, the error's details) and, for retryable errors, ``RetryInfo``. Anything else is our bug: it is
logged with its traceback and answered ``INTERNAL`` without internals in the message.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from polar_core.errors import PolarError, ResourceExhausted, Unavailable

__all__ = ["ErrorMappingInterceptor", "status_for"]

_log = logging.getLogger(__name__)
_DOMAIN = "polar.dev"


def status_for(exc: PolarError) -> tuple[grpc.StatusCode, status_pb2.Status]:
    """Return the status code and rich ``google.rpc.Status`` for ``exc``."""
    code = getattr(grpc.StatusCode, exc.code_name)
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=type(exc).__name__, domain=_DOMAIN, metadata=exc.details))
    details = [info]
    retry_after = getattr(exc, "retry_after_s", None)
    if isinstance(exc, ResourceExhausted | Unavailable) and retry_after is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(retry_after * 1e9))
        retry = any_pb2.Any()
        retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(retry)
    status = status_pb2.Status(code=getattr(code_pb2, exc.code_name), message=exc.message, details=details)
    return code, status


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
    if isinstance(exc, PolarError):
        code, status = status_for(exc)
        await context.abort(
            code, exc.message, trailing_metadata=(("grpc-status-details-bin", status.SerializeToString()),)
        )
    incident = uuid.uuid4().hex[:12]
    _log.error("internal error %s", incident, exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error (incident {incident}; see the server log)")


def _wrap_unary(behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)
            raise  # unreachable: abort raises

    return wrapped


def _wrap_streaming(behavior: Callable[..., Any]) -> Callable[..., AsyncIterator[Any]]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        try:
            result = behavior(request, context)
            if hasattr(result, "__aiter__"):
                async for item in result:
                    yield item
            else:
                await result
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return wrapped


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Wraps every handler so raised exceptions become precise status codes."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(_wrap_unary(handler.unary_unary), **kwargs)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(_wrap_unary(handler.stream_unary), **kwargs)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(_wrap_streaming(handler.unary_stream), **kwargs)
        return grpc.stream_stream_rpc_method_handler(_wrap_streaming(handler.stream_stream), **kwargs)  # type: ignore[arg-type]
