"""The one place where exceptions become HTTP statuses (rendered in the caller's provider shape)."""

from __future__ import annotations

import logging
import math

from model_proxy.errors import ContextLengthExceeded, RequestTooLarge, TooManyCalls
from model_proxy.protocols.base import ErrorInfo
from polar_core.errors import (
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PolarError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)

__all__ = ["error_info", "retry_headers"]

_log = logging.getLogger(__name__)


def error_info(exc: BaseException, *, protocol: str, retry_after_s: float) -> ErrorInfo:
    """Map an exception to a status and kind; anything not a :class:`PolarError` is our bug (500).

    Overload is 529 for Anthropic (its own overload status) and 503 elsewhere; a body over the limit is 413 and
    a session over its concurrent-call cap is 429 (retryable) in every protocol.
    """
    if isinstance(exc, RequestTooLarge):
        return ErrorInfo(413, "too_large", exc.message)
    if isinstance(exc, TooManyCalls):
        return ErrorInfo(429, "rate_limit", exc.message, exc.retry_after_s or retry_after_s)
    if isinstance(exc, ContextLengthExceeded):
        return ErrorInfo(400, "context_length", exc.message, prompt_tokens=exc.prompt_tokens, limit=exc.limit)
    if isinstance(exc, InvalidArgument):
        return ErrorInfo(400, "invalid_request", exc.message)
    if isinstance(exc, Unauthenticated):
        return ErrorInfo(401, "authentication", exc.message)
    if isinstance(exc, PermissionDenied):
        return ErrorInfo(403, "permission", exc.message)
    if isinstance(exc, NotFound):
        return ErrorInfo(404, "not_found", exc.message)
    if isinstance(exc, FailedPrecondition | AlreadyExists):
        return ErrorInfo(409, "conflict", exc.message)
    if isinstance(exc, ResourceExhausted):
        status = 529 if protocol == "anthropic_messages" else 503
        return ErrorInfo(status, "overloaded", exc.message, exc.retry_after_s or retry_after_s)
    if isinstance(exc, Unavailable):
        return ErrorInfo(503, "unavailable", exc.message, exc.retry_after_s or retry_after_s)
    if isinstance(exc, Cancelled):
        return ErrorInfo(503, "unavailable", exc.message, retry_after_s)
    if isinstance(exc, DeadlineExceeded):
        return ErrorInfo(504, "timeout", exc.message, retry_after_s)
    if isinstance(exc, Unimplemented):
        return ErrorInfo(501, "unimplemented", exc.message)
    if isinstance(exc, PolarError):
        _log.error("internal error: %s", exc.message)
        return ErrorInfo(500, "internal", "internal error in the model proxy")
    _log.error("unexpected %s in the model proxy", type(exc).__name__, exc_info=exc)
    return ErrorInfo(500, "internal", "internal error in the model proxy")


def retry_headers(info: ErrorInfo) -> dict[str, str]:
    """``retry-after`` (whole seconds, at least 1) and the SDKs' ``x-should-retry`` for retryable errors."""
    if info.retry_after_s is None:
        return {}
    seconds = max(1, math.ceil(info.retry_after_s))
    return {"retry-after": str(seconds), "x-should-retry": "true"}
