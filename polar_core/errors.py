"""Errors shared by every Polar service.

Domain code raises these (or subclasses defined in each service's own ``errors.py``); it never imports grpc.
One interceptor per process (:mod:`polar_core.grpc_errors`) maps them to gRPC status codes at the edge, and the
model proxy's HTTP layer maps them to provider-shaped JSON errors.

Hierarchy::

    PolarError                      -> INTERNAL (a bug of ours, never reported as a client error)
    ├── InvalidArgument             -> INVALID_ARGUMENT
    ├── NotFound                    -> NOT_FOUND
    ├── AlreadyExists               -> ALREADY_EXISTS
    ├── FailedPrecondition          -> FAILED_PRECONDITION
    ├── Aborted                     -> ABORTED (a concurrent operation conflicts; retry later)
    ├── ResourceExhausted           -> RESOURCE_EXHAUSTED (with retry info)
    ├── Unavailable                 -> UNAVAILABLE (with retry info)
    ├── Unauthenticated             -> UNAUTHENTICATED
    ├── PermissionDenied            -> PERMISSION_DENIED
    ├── DeadlineExceeded            -> DEADLINE_EXCEEDED
    ├── Cancelled                   -> CANCELLED
    ├── Unimplemented               -> UNIMPLEMENTED
    └── Internal                    -> INTERNAL
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "PolarError",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
]


class PolarError(Exception):
    """Base class of every error a Polar service raises on purpose.

    Attributes:
        message: A sentence for the caller; it must not contain secrets (tokens, keys).
        details: Machine-readable key/value context, sent as gRPC ``ErrorInfo`` metadata.
        code_name: The gRPC status code name this error maps to.
    """

    code_name = "INTERNAL"

    def __init__(self, message: str, *, details: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, str] = dict(details or {})


class InvalidArgument(PolarError):
    """The request itself is wrong; retrying it unchanged will fail again."""

    code_name = "INVALID_ARGUMENT"


class NotFound(PolarError):
    """The named entity does not exist."""

    code_name = "NOT_FOUND"


class AlreadyExists(PolarError):
    """An entity with that id exists with different content."""

    code_name = "ALREADY_EXISTS"


class FailedPrecondition(PolarError):
    """The entity is in the wrong state for the operation."""

    code_name = "FAILED_PRECONDITION"


class Aborted(PolarError):
    """A concurrent operation on the same entity conflicts with this one; retry once it has finished."""

    code_name = "ABORTED"


class _Retryable(PolarError):
    def __init__(
        self, message: str, *, retry_after_s: float | None = None, details: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message, details=details)
        self.retry_after_s = retry_after_s


class ResourceExhausted(_Retryable):
    """Capacity is full; retry after ``retry_after_s`` seconds."""

    code_name = "RESOURCE_EXHAUSTED"


class Unavailable(_Retryable):
    """A dependency is down or starting; retry after ``retry_after_s`` seconds."""

    code_name = "UNAVAILABLE"


class Unauthenticated(PolarError):
    """No valid credentials were presented."""

    code_name = "UNAUTHENTICATED"


class PermissionDenied(PolarError):
    """The caller is authenticated but may not do this."""

    code_name = "PERMISSION_DENIED"


class DeadlineExceeded(PolarError):
    """The operation ran out of time."""

    code_name = "DEADLINE_EXCEEDED"


class Cancelled(PolarError):
    """The operation was cancelled."""

    code_name = "CANCELLED"


class Unimplemented(PolarError):
    """The operation is not implemented (the message says which operation and what to use instead, if anything)."""

    code_name = "UNIMPLEMENTED"


class Internal(PolarError):
    """A bug or broken invariant on our side."""

    code_name = "INTERNAL"
