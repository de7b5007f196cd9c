"""Errors of the rollout server.

Client-facing errors are :mod:`polar_core.errors` (mapped to status codes by the shared interceptor). The
classes below describe what a gateway or a trainer callback answered; the scheduler and the deliverer catch
them, and should one escape it still maps to a sensible status::

    polar_core.errors.PolarError
    ├── ResourceExhausted
    │   └── GatewayBusy            the gateway is full; retry after ``retry_after_s``
    ├── Unavailable
    │   └── GatewayUnreachable     the gateway did not answer (down, timed out)
    ├── FailedPrecondition
    │   ├── GatewayRejected        the gateway refused the session (bad spec, draining, other attempt)
    │   └── StaleAttempt           a report for an attempt that is no longer current
    ├── NotFound
    │   └── GatewaySessionUnknown  the gateway does not know the session (lost, e.g. after its restart)
    └── Unavailable
        └── DeliveryFailed         a callback delivery failed; ``retryable`` says whether to try again
"""

from __future__ import annotations

from polar_core.errors import FailedPrecondition, NotFound, ResourceExhausted, Unavailable

__all__ = [
    "DeliveryFailed",
    "GatewayBusy",
    "GatewayRejected",
    "GatewaySessionUnknown",
    "GatewayUnreachable",
    "StaleAttempt",
]


class GatewayBusy(ResourceExhausted):
    """The gateway answered RESOURCE_EXHAUSTED; ``retry_after_s`` is its hint (or ``None``)."""


class GatewayUnreachable(Unavailable):
    """The gateway could not be reached or did not answer in time."""


class GatewayRejected(FailedPrecondition):
    """The gateway refused the session for a reason retrying elsewhere might fix (``draining`` says which)."""

    def __init__(self, message: str, *, draining: bool = False) -> None:
        super().__init__(message)
        self.draining = draining


class GatewaySessionUnknown(NotFound):
    """The gateway does not know the session."""


class StaleAttempt(FailedPrecondition):
    """A result for an attempt that is no longer the session's current one."""


class DeliveryFailed(Unavailable):
    """A callback delivery failed; ``retryable`` is false when the trainer rejected the result for good."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable
