"""The client side of the error mapping: one place turns a failed gRPC call into a :mod:`polar_core.errors` error.

:mod:`polar_core.grpc_errors` maps exceptions to status codes on the server; this module is its inverse for
callers, so every client in every service retries ``Unavailable``/``ResourceExhausted`` (honouring the server's
``RetryInfo``), scores ``DeadlineExceeded`` and reports the rest the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import grpc
from google.rpc import error_details_pb2, status_pb2

from polar_core import errors

__all__ = ["error_from_rpc", "retry_after_s", "rpc"]

_T = TypeVar("_T")

_ERRORS: dict[grpc.StatusCode, type[errors.PolarError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.ABORTED: errors.Aborted,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
    grpc.StatusCode.CANCELLED: errors.Cancelled,
    grpc.StatusCode.UNIMPLEMENTED: errors.Unimplemented,
}


def retry_after_s(error: grpc.aio.AioRpcError) -> float | None:
    """The ``RetryInfo`` delay the server attached to a failed call, in seconds, if it sent one."""
    metadata: Any = error.trailing_metadata() or ()
    for key, value in metadata:
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        for detail in status_pb2.Status.FromString(value).details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                detail.Unpack(info)
                return float(info.retry_delay.ToNanoseconds()) / 1e9
    return None


def error_from_rpc(
    error: grpc.aio.AioRpcError, what: str, *, details: Mapping[str, str] | None = None
) -> errors.PolarError:
    """Return the :mod:`polar_core.errors` exception for a failed call to ``what`` (an address or a name).

    ``UNAVAILABLE`` and ``RESOURCE_EXHAUSTED`` keep the server's retry delay; a code with no counterpart
    (``INTERNAL``, ``UNKNOWN``, ``DATA_LOSS``) becomes :class:`~polar_core.errors.Internal`.
    """
    code = error.code()
    message = f"{what}: {error.details() or code.name}"
    if code == grpc.StatusCode.UNAVAILABLE:
        return errors.Unavailable(message, retry_after_s=retry_after_s(error), details=details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.ResourceExhausted(message, retry_after_s=retry_after_s(error), details=details)
    return _ERRORS.get(code, errors.Internal)(message, details=details)


async def rpc(call: Awaitable[_T], what: str, *, details: Mapping[str, str] | None = None) -> _T:
    """Await one unary call, raising :func:`error_from_rpc`'s exception instead of ``AioRpcError``."""
    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        raise error_from_rpc(exc, what, details=details) from None
