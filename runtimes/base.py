"""The runtime seam: a sandbox in which harnesses run and evaluators score.

A runtime owns one *session directory*. Commands run inside the sandbox; files move in and out only below
the session directory (``upload``/``download`` refuse anything else). ``root`` is the session directory's
path as commands inside the runtime see it.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Protocol, runtime_checkable

from runtimes.errors import PathEscapesSession

__all__ = ["ExecResult", "Runtime", "resolve_in_root"]


@dataclasses.dataclass(frozen=True, slots=True)
class ExecResult:
    """The outcome of one command.

    Attributes:
        exit_code: The process's exit status; negative for a signal (local runtimes), -1 when unknown.
        stdout: Captured standard output (decoded with replacement; the tail is kept when it is long).
        stderr: Captured standard error (same treatment).
        timed_out: Whether the command was killed because it ran past its timeout.
        duration_s: Wall-clock seconds the command ran.
    """

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out


@runtime_checkable
class Runtime(Protocol):
    """A sandbox with a session directory. Implementations: local, docker, apptainer."""

    @property
    def session_id(self) -> str:
        """The id of the session this runtime belongs to."""
        ...

    @property
    def root(self) -> PurePosixPath:
        """The session directory, as commands inside the runtime see it."""
        ...

    async def start(self) -> None:
        """Create the sandbox and its session directory (with ``home/`` and ``tmp/``)."""
        ...

    async def stop(self) -> None:
        """Destroy the sandbox and everything in it. Idempotent."""
        ...

    async def cancel(self) -> None:
        """Kill running commands and destroy the sandbox; later calls raise ``RuntimeCancelled``."""
        ...

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | PurePosixPath | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float,  # noqa: ASYNC109 - enforced inside the sandbox, which kills the process group
    ) -> ExecResult:
        """Run a command; kill its whole process tree when it runs past ``timeout`` seconds.

        Raises:
            RuntimeNotStarted: The runtime is not running.
            RuntimeDied: The sandbox vanished.
            RuntimeCancelled: The runtime was cancelled.
        """
        ...

    async def upload(self, src: Path | bytes, dest: str | PurePosixPath, *, exclude: Sequence[str] = ()) -> None:
        """Copy a host file or directory (or bytes) to ``dest`` below the session directory.

        Args:
            src: Host path (file or directory) or file contents.
            dest: Destination, relative to ``root`` or absolute below it.
            exclude: Glob patterns of names to skip when copying a directory (e.g. ``.git``).

        Raises:
            PathEscapesSession: ``dest`` is outside the session directory.
        """
        ...

    async def download(self, src: str | PurePosixPath) -> bytes:
        """Return the contents of a regular file below the session directory.

        Raises:
            PathEscapesSession: ``src`` is outside the session directory.
            polar_core.errors.NotFound: There is no such regular file.
        """
        ...


def resolve_in_root(root: PurePosixPath, path: str | PurePosixPath) -> PurePosixPath:
    """Resolve ``path`` (relative to ``root``, or absolute) lexically and require it to stay inside.

    Raises:
        PathEscapesSession: The normalised path is not ``root`` or below it.
    """
    raw = str(path)
    if "\x00" in raw:
        raise PathEscapesSession("path contains a NUL byte")
    joined = raw if posixpath.isabs(raw) else posixpath.join(str(root), raw)
    normal = PurePosixPath(posixpath.normpath(joined))
    if normal != root and root not in normal.parents:
        raise PathEscapesSession(f"path {raw!r} is outside the session directory", details={"path": raw})
    return normal
