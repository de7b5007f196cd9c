"""Errors raised by runtimes.

Hierarchy (all are :mod:`polar_core.errors` classes, so the gRPC edge maps them without knowing runtimes)::

    polar_core.errors.InvalidArgument
    ├── PathEscapesSession      a path leaves the session directory
    ├── FileTooLarge            a file to download is over the download limit
    └── DiskQuotaExceeded       the sandbox's files outgrew its disk quota (its processes were killed)
    polar_core.errors.FailedPrecondition
    ├── RuntimeNotStarted       exec/upload/download before start() or after stop()
    ├── IsolationUnavailable    this host cannot provide the operator's minimum isolation
    └── DiskSpaceUnavailable    the session's disk quota is larger than the host's free space for sessions
    polar_core.errors.Unavailable
    └── RuntimeDied             the sandbox vanished underneath us (container killed, directory removed)
    polar_core.errors.Cancelled
    └── RuntimeCancelled        cancel() was called; in-flight and later calls raise this
"""

from __future__ import annotations

from polar_core.errors import Cancelled, FailedPrecondition, InvalidArgument, Unavailable

__all__ = [
    "DiskQuotaExceeded",
    "DiskSpaceUnavailable",
    "FileTooLarge",
    "IsolationUnavailable",
    "PathEscapesSession",
    "RuntimeCancelled",
    "RuntimeDied",
    "RuntimeNotStarted",
]


class PathEscapesSession(InvalidArgument):
    """A path given to upload or download resolves outside the session directory."""


class FileTooLarge(InvalidArgument):
    """A file to download is larger than the runtime's download limit (the sandbox made it; it is not read)."""


class DiskQuotaExceeded(InvalidArgument):
    """The sandbox's files used more disk than its quota (``disk_limit``); the agent's doing, never infra.

    Raised by the command during which the watchdog saw the quota broken (after killing the sandbox's
    processes) and by every later command of that runtime.
    """


class RuntimeNotStarted(FailedPrecondition):
    """The runtime is not running (never started, or stopped)."""


class RuntimeDied(Unavailable):
    """The runtime stopped working underneath its owner; an infrastructure failure, never a model failure."""


class RuntimeCancelled(Cancelled):
    """The runtime was cancelled."""


class IsolationUnavailable(FailedPrecondition):
    """This host cannot provide the isolation the operator requires (the message names what is missing)."""


class DiskSpaceUnavailable(FailedPrecondition):
    """The session's disk quota (``disk_limit``) is larger than what this host's disk can still hold for it."""
