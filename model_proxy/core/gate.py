"""The generation gate: PauseGeneration holds new calls and drains (or aborts) the ones in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from model_proxy.errors import BackendTimeout

__all__ = ["GenerationGate"]


class GenerationGate:
    """Counts calls in flight and holds new ones while paused (for weight updates).

    A call enters the gate before it is sent to the backend and leaves it when its record is written; the
    policy version is read after entering, so calls held across a weight update carry the new version.
    """

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight: dict[int, Callable[[], None]] = {}
        self._held = 0
        self._next = 0

    @property
    def paused(self) -> bool:
        """Whether new calls are held."""
        return not self._open.is_set()

    @property
    def held(self) -> int:
        """Number of calls waiting at the gate for a pause to end."""
        return self._held

    @property
    def in_flight(self) -> int:
        """Number of calls between :meth:`enter` and :meth:`leave`."""
        return len(self._in_flight)

    async def enter(self, abort: Callable[[], None]) -> int:
        """Wait until generation is allowed, then register a call; returns its ticket.

        Args:
            abort: Called by :meth:`pause` with ``abort_in_flight`` to stop this call.
        """
        while not self._open.is_set():
            self._held += 1
            try:
                await self._open.wait()
            finally:
                self._held -= 1
        ticket = self._next
        self._next += 1
        self._in_flight[ticket] = abort
        self._idle.clear()
        return ticket

    def leave(self, ticket: int) -> None:
        """Unregister a call (idempotent)."""
        self._in_flight.pop(ticket, None)
        if not self._in_flight:
            self._idle.set()

    async def pause(self, *, abort_in_flight: bool, drain_timeout_s: float) -> tuple[int, int]:
        """Hold new calls and wait for the ones in flight.

        Returns:
            (calls in flight when the pause began, calls aborted).

        Raises:
            BackendTimeout: In-flight calls did not finish within ``drain_timeout_s`` (the pause stays on).
        """
        self._open.clear()
        in_flight = len(self._in_flight)
        aborted = 0
        if abort_in_flight:
            for abort in list(self._in_flight.values()):
                abort()
                aborted += 1
        try:
            async with asyncio.timeout(drain_timeout_s):
                await self._idle.wait()
        except TimeoutError:
            raise BackendTimeout(
                f"{len(self._in_flight)} calls still in flight after {drain_timeout_s:.0f} s"
            ) from None
        return in_flight, aborted

    def resume(self) -> int:
        """Release held calls; returns how many were waiting."""
        held = self._held
        self._open.set()
        return held
