"""Fan-out of session events to watchers, each with a bounded buffer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection

from gateway.models import SessionEvent
from polar_core.errors import Unavailable

__all__ = ["EventBus", "Subscription"]


class Subscription:
    """One watcher's stream of events; iterate it, and close it when done (the bus then forgets it)."""

    def __init__(self, bus: EventBus, task_id: str, session_ids: Collection[str], buffer: int) -> None:
        self._bus = bus
        self._task_id = task_id
        self._session_ids = frozenset(session_ids)
        self._queue: asyncio.Queue[SessionEvent] = asyncio.Queue(maxsize=buffer)
        self._overflowed = False

    def matches(self, event: SessionEvent) -> bool:
        """Whether the watcher asked for ``event``'s session."""
        state = event.state
        if self._task_id and state.task_id != self._task_id:
            return False
        return not self._session_ids or state.session_id in self._session_ids

    def offer(self, event: SessionEvent) -> None:
        """Queue ``event``; a watcher whose buffer is full is marked as fallen behind."""
        if self._overflowed or not self.matches(event):
            return
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self._overflowed = True

    async def __aiter__(self) -> AsyncIterator[SessionEvent]:
        """Yield events until closed; raises ``Unavailable`` once the watcher has fallen behind."""
        while True:
            if self._overflowed and self._queue.empty():
                raise Unavailable(
                    "the watcher fell behind and missed events; watch again with include_current",
                    retry_after_s=0.0,
                )
            yield await self._queue.get()

    def close(self) -> None:
        """Stop receiving events. Idempotent."""
        self._bus._forget(self)


class EventBus:
    """Delivers every published event to the matching subscriptions."""

    def __init__(self, buffer: int) -> None:
        self._buffer = buffer
        self._subscriptions: set[Subscription] = set()

    def subscribe(self, task_id: str = "", session_ids: Collection[str] = ()) -> Subscription:
        """Return a new subscription to events of ``task_id`` and/or ``session_ids`` (empty means all)."""
        sub = Subscription(self, task_id, session_ids, self._buffer)
        self._subscriptions.add(sub)
        return sub

    def publish(self, event: SessionEvent) -> None:
        """Offer ``event`` to every subscription."""
        for sub in self._subscriptions:
            sub.offer(event)

    def _forget(self, sub: Subscription) -> None:
        self._subscriptions.discard(sub)
