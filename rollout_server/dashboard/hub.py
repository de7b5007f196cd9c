"""The dashboard's sampler: one loop builds a snapshot per interval while at least one browser watches.

With no watcher nothing runs (the dashboard costs a run that never opens it one idle listening socket). Every
watcher gets the latest snapshot; a slow one skips snapshots instead of queueing them. The samples taken while
watched form the "over time" series (sessions by stage), kept in a bounded ring; each
point carries a sequence number so a stream sends a watcher the whole ring once and only the new points after
(:func:`event_body`), not the ring every second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from rollout_server.dashboard.data import DashboardData
from rollout_server.dashboard.proxy_metrics import ProxyMetricsSource

__all__ = ["HISTORY_POINTS", "SnapshotHub", "event_body"]

_log = logging.getLogger(__name__)
HISTORY_POINTS = 720


class SnapshotHub:
    """Fans snapshots out to watchers.

    Args:
        data: Builds snapshots from the store.
        proxies: Reads model-call figures from the proxies.
        interval_s: Seconds between snapshots while watched.
    """

    def __init__(self, data: DashboardData, proxies: ProxyMetricsSource, *, interval_s: float = 1.0) -> None:
        self.data = data
        self.proxies = proxies
        self.interval_s = interval_s
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_POINTS)
        self.snapshots_built = 0
        self._seq = 0
        self._watchers: set[asyncio.Queue[dict[str, Any]]] = set()
        self._loop: asyncio.Task[None] | None = None
        self._latest: dict[str, Any] | None = None

    @property
    def watchers(self) -> int:
        """Browsers watching now."""
        return len(self._watchers)

    async def build(self) -> dict[str, Any]:
        """Build one snapshot (and record its point of the over-time series)."""
        snapshot = await self.data.snapshot()
        snapshot["proxy"] = await self.proxies.read()
        self.snapshots_built += 1
        self._seq += 1
        snapshot["seq"] = self._seq  # the page exposes it (data-snapshot-seq): which snapshot it shows
        point = {"seq": self._seq, "t": snapshot["now"], "sessions": snapshot["sessions_by_stage"]}
        self.history.append(point)
        snapshot["history"] = list(self.history)
        self._latest = snapshot
        return snapshot

    async def _run(self) -> None:
        while self._watchers:
            try:
                snapshot = await self.build()
            except Exception:  # a display loop: log, keep serving the last snapshot, try again
                _log.exception("dashboard snapshot failed")
            else:
                for queue in list(self._watchers):
                    if queue.full():
                        queue.get_nowait()
                    queue.put_nowait(snapshot)
            await asyncio.sleep(self.interval_s)

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
        """Subscribe for the life of the context; the first watcher starts the loop, the last stops it."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=1)
        if self._latest is not None:
            queue.put_nowait(self._latest)
        self._watchers.add(queue)
        if self._loop is None or self._loop.done():
            self._loop = asyncio.create_task(self._run(), name="dashboard-sampler")
        try:
            yield queue
        finally:
            self._watchers.discard(queue)
            if not self._watchers and self._loop is not None:
                self._loop.cancel()
                await asyncio.gather(self._loop, return_exceptions=True)
                self._loop = None

    async def close(self) -> None:
        """Stop the loop and the proxies' HTTP client."""
        self._watchers.clear()
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
            self._loop = None
        await self.proxies.close()


def event_body(snapshot: dict[str, Any], sent: int) -> tuple[dict[str, Any], int]:
    """What a stream sends for ``snapshot`` to a watcher that has the points up to ``sent``, and the new ``sent``.

    The first event (``sent`` 0), or one after a gap the ring no longer covers, carries the whole ``history``;
    the others carry ``history_append``: the points after ``sent`` only. ``snapshot`` is shared, never changed.
    """
    history: list[dict[str, Any]] = snapshot["history"]
    latest = history[-1]["seq"] if history else sent
    if sent == 0 or not history or history[0]["seq"] > sent + 1:
        return snapshot, latest
    body = {k: v for k, v in snapshot.items() if k != "history"}
    body["history_append"] = [point for point in history if point["seq"] > sent]
    return body, latest
