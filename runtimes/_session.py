"""What the local, Docker and Apptainer runtimes share: their spec and session id, the cancelled flag, the
session directory's layout and the environment every command gets."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import PurePosixPath

from runtimes.errors import RuntimeCancelled, RuntimeNotStarted
from runtimes.spec import NetworkMode, RuntimeSpec

__all__ = ["SESSION_SUBDIRS", "SessionRuntime"]

SESSION_SUBDIRS = ("home", "tmp", ".polar")
"""Created in every session directory at start: ``HOME``, ``TMPDIR`` and Polar's own files (the tunnel)."""


class SessionRuntime(abc.ABC):
    """The common part of a runtime implementation (each one satisfies :class:`runtimes.base.Runtime`).

    Args:
        spec: The runtime spec.
        session_id: The session this runtime belongs to.
    """

    def __init__(self, spec: RuntimeSpec, *, session_id: str) -> None:
        self._spec = spec
        self._session_id = session_id
        self._cancelled = False

    @property
    def session_id(self) -> str:
        """The id of the session this runtime belongs to."""
        return self._session_id

    @property
    def spec(self) -> RuntimeSpec:
        """The spec this runtime was built from."""
        return self._spec

    @property
    @abc.abstractmethod
    def root(self) -> PurePosixPath:
        """The session directory, as commands inside the runtime see it."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Destroy the sandbox and everything in it. Idempotent."""

    async def cancel(self) -> None:
        """Kill running commands and destroy the sandbox; in-flight and later calls raise RuntimeCancelled."""
        self._cancelled = True
        await self.stop()

    def _raise_if_cancelled(self, when: str = "") -> None:
        """Raise :class:`RuntimeCancelled` once :meth:`cancel` was called (``when`` ends the message)."""
        if self._cancelled:
            raise RuntimeCancelled(f"runtime was cancelled{when}")

    def _raise_unless_started(self, started: bool) -> None:
        """Raise for a cancelled runtime, then for one that is not running."""
        self._raise_if_cancelled()
        if not started:
            raise RuntimeNotStarted(f"runtime {self._session_id} is not running")

    def _own_variables(self) -> dict[str, str]:
        """The variables the runtime itself sets, before the spec's and the caller's."""
        own = {
            "HOME": str(self.root / "home"),
            "TMPDIR": str(self.root / "tmp"),
            "LANG": "C.UTF-8",
            "POLAR_SESSION_DIR": str(self.root),
        }
        if self._spec.network is NetworkMode.PROXY:
            own["POLAR_PROXY_URL"] = f"http://127.0.0.1:{self._spec.proxy_port}"
        return own

    def environment(self, env: Mapping[str, str] | None) -> dict[str, str]:
        """The complete environment a command gets: the runtime's variables, the spec's, then ``env``."""
        merged = self._own_variables()
        merged.update(self._spec.env)
        merged.update(env or {})
        return merged
