"""Errors of the gateway.

Hierarchy (all from :mod:`polar_core.errors`, mapped to status codes by the shared interceptor)::

    NotFound
    └── SessionNotFound          the session id is unknown (or its result was evicted)
    AlreadyExists
    └── SessionConflict          the session id runs with another attempt
    FailedPrecondition
    └── GatewayDraining          the gateway accepts no new sessions
    InvalidArgument
    └── PatchTooLarge            the workspace patch (or a file in it) is over the patch limit: invalid_patch
    ResourceExhausted
    └── GatewayBusy              admission refused: full, or POSTRUN backed up (carries retry_after_s)
    DeadlineExceeded
    ├── StepTimedOut             one side effect ran past its own time limit
    └── SessionDeadlinePassed    the session's deadline passed
"""

from __future__ import annotations

from polar_core.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)

__all__ = [
    "GatewayBusy",
    "GatewayDraining",
    "PatchTooLarge",
    "SessionConflict",
    "SessionDeadlinePassed",
    "SessionNotFound",
    "StepTimedOut",
]


class SessionNotFound(NotFound):
    """The session id is unknown to this gateway."""


class SessionConflict(AlreadyExists):
    """The session id is running with a different attempt."""


class GatewayDraining(FailedPrecondition):
    """The gateway is draining and accepts no new sessions."""


class PatchTooLarge(InvalidArgument):
    """The agent's workspace patch, or one file in the workspace, is larger than the gateway's patch limit."""


class GatewayBusy(ResourceExhausted):
    """The gateway refuses new sessions for now; retry after ``retry_after_s``."""


class StepTimedOut(DeadlineExceeded):
    """A pipeline step ran past its own time limit."""


class SessionDeadlinePassed(DeadlineExceeded):
    """The session's deadline passed."""
