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
    ├── RuntimeDied             the sandbox vanished underneath us (container killed, directory removed)
    └── DiskSpaceHeld           the free space would hold the quota, but running sessions' quotas hold it now
    polar_core.errors.Cancelled
    └── RuntimeCancelled        cancel() was called; in-flight and later calls raise this
"""

from __future__ import annotations

from polar_core.errors import Cancelled, FailedPrecondition, InvalidArgument, Unavailable

__all__ = [
    "DiskQuotaExceeded",
    "DiskSpaceHeld",
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
    """The session's disk quota (``disk_limit``) is larger than this host's free disk space."""


class DiskSpaceHeld(Unavailable):
    """The free disk space would hold the session's quota, but running sessions' quotas may still grow into it.

    Temporary, not the session's fault: the gateway hands the session back as an outage (it runs again later or on
    another host without using an attempt), as for any unavailable dependency.
    """
