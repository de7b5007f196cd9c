"""Stage pools: a fixed number of slots per pipeline stage, granted in priority order.

A session holds a slot while a stage serves it; sessions waiting for a slot form the stage's queue. Each pool
counts what Little's law needs (queue length, occupancy, entries, exits, residence time) and tells an
observer, so the numbers can be exported as metrics and checked from outside.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol

from gateway.models import Stage, StageSnapshot

__all__ = ["PoolObserver", "Slot", "StagePool", "StageSnapshot"]


class PoolObserver(Protocol):
    """Receives a pool's events (the metrics recorder implements it)."""

    def slot_granted(self, stage: Stage, wait_s: float) -> None:
        """A session entered ``stage`` after waiting ``wait_s`` seconds for a slot."""
        ...

    def slot_released(self, stage: Stage, residence_s: float) -> None:
        """A session left ``stage`` after holding its slot ``residence_s`` seconds."""
        ...


class Slot:
    """A held slot of a pool; release it exactly once (further releases are no-ops)."""

    __slots__ = ("_entered_at", "_pool", "_released")

    def __init__(self, pool: StagePool, entered_at: float) -> None:
        self._pool = pool
        self._entered_at = entered_at
        self._released = False

    @property
    def held(self) -> bool:
        """Whether the slot is still held."""
        return not self._released

    def release(self) -> None:
        """Give the slot back, recording how long it was held."""
        if self._released:
            return
        self._released = True
        self._pool._release(self._pool._clock() - self._entered_at)


class StagePool:
    """Slots of one stage; waiters are served by priority (higher first), then in arrival order."""

    def __init__(
        self,
        stage: Stage,
        workers: int,
        *,
        observer: PoolObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if workers < 1:
            raise ValueError(f"{stage} pool needs at least one slot")
        self.stage = stage
        self.workers = workers
        self._observer = observer
        self._clock = clock
        self._occupancy = 0
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._waiting = 0
        self._arrivals = itertools.count()
        self._entered = 0
        self._exited = 0
        self._residence_sum = 0.0

    @property
    def queue_length(self) -> int:
        """Sessions waiting for a slot."""
        return self._waiting

    @property
    def occupancy(self) -> int:
        """Slots held."""
        return self._occupancy

    def snapshot(self) -> StageSnapshot:
        """Return the pool's counters."""
        mean = self._residence_sum / self._exited if self._exited else 0.0
        return StageSnapshot(
            self.stage, self.workers, self._waiting, self._occupancy, self._entered, self._exited, mean
        )

    async def acquire(self, priority: int = 0) -> Slot:
        """Wait for a slot and return it; cancelling the wait leaves the queue cleanly."""
        start = self._clock()
        if self._occupancy < self.workers and self._waiting == 0:
            return self._grant(start)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (-priority, next(self._arrivals), future))
        self._waiting += 1
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                # The slot was granted just as the wait was cancelled: hand it on.
                self._occupancy -= 1
                self._entered -= 1
                self._wake()
            else:
                self._waiting -= 1
                future.cancel()
            raise
        self._observe_grant(start)
        return Slot(self, self._clock())

    def _observe_grant(self, start: float) -> None:
        if self._observer is not None:
            self._observer.slot_granted(self.stage, self._clock() - start)

    def _grant(self, start: float) -> Slot:
        self._occupancy += 1
        self._entered += 1
        self._observe_grant(start)
        return Slot(self, self._clock())

    def _release(self, residence_s: float) -> None:
        self._occupancy -= 1
        self._exited += 1
        self._residence_sum += residence_s
        if self._observer is not None:
            self._observer.slot_released(self.stage, residence_s)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._occupancy < self.workers:
            _, _, future = heapq.heappop(self._waiters)
            if future.done():  # its waiter was cancelled and already left the count
                continue
            self._waiting -= 1
            self._occupancy += 1
            self._entered += 1
            future.set_result(None)
