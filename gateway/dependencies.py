"""Whether the gateway's dependencies (model proxy, evaluator, reconstructor) are reachable, and when they were not.

:class:`DependencyMonitor` probes each dependency's gRPC health service about once a second in the background
and caches the answers, so admission and capacity reads cost nothing. While any dependency is unreachable the
gateway advertises no capacity and refuses new sessions (RESOURCE_EXHAUSTED with a short retry delay): an
outage must not be turned into sessions the policy is blamed for. The monitor also remembers recent outages,
so the pipeline can tell that a harness whose calls failed during RUN failed because the proxy was down.

Domain code only: the probes are :class:`gateway.ports.HealthProbe` implementations (the gRPC clients).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping

from gateway.ports import HealthProbe

__all__ = ["PROXY", "DependencyMonitor", "Outage"]

_log = logging.getLogger(__name__)

PROXY = "proxy"
"""The name of the model proxy among the monitored dependencies."""

_KEPT_OUTAGES = 32


@dataclasses.dataclass(slots=True)
class Outage:
    """A time a dependency was seen unreachable; ``end`` is ``None`` while it lasts."""

    start: float
    end: float | None = None

    def overlaps(self, start: float, end: float) -> bool:
        """Whether the outage overlaps ``[start, end]``."""
        return self.start <= end and (self.end is None or self.end >= start)


class DependencyMonitor:
    """Probes dependencies' health in the background and answers from the cached result.

    Args:
        probes: Dependency name → its health probe.
        interval_s: Seconds between probe rounds.
        timeout_s: Limit on each probe; a probe that does not answer in time counts as failed.
        failures_to_down: Consecutive failed probes before a dependency counts as unreachable (a busy host
            may miss one probe's time limit); the outage is dated from the first of them.
        clock: Unix time, for the outage record.
    """

    def __init__(
        self,
        probes: Mapping[str, HealthProbe],
        *,
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
        failures_to_down: int = 2,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._probes = dict(probes)
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._failures_to_down = max(failures_to_down, 1)
        self._failed_since: dict[str, tuple[float, int]] = {}
        self._down: set[str] = set()
        self._outages: dict[str, collections.deque[Outage]] = {
            name: collections.deque(maxlen=_KEPT_OUTAGES) for name in self._probes
        }
        self._task: asyncio.Task[None] | None = None

    def unavailable(self) -> list[str]:
        """The dependencies the last probe round found unreachable (sorted)."""
        return sorted(self._down)

    def down_during(self, name: str, start: float, end: float) -> Outage | None:
        """The latest outage of ``name`` overlapping ``[start, end]``, if any."""
        for outage in reversed(self._outages.get(name, ())):
            if outage.overlaps(start, end):
                return outage
        return None

    async def probe_once(self) -> None:
        """Probe every dependency once and update the record."""
        names = list(self._probes)
        answers = await asyncio.gather(*(self._probe(self._probes[n]) for n in names))
        now = self._clock()
        for name, healthy in zip(names, answers, strict=True):
            if healthy:
                self._failed_since.pop(name, None)
                if name in self._down:
                    _log.info("dependency %s is reachable again", name)
                    self._down.discard(name)
                    self._outages[name][-1].end = now
                continue
            since, count = self._failed_since.get(name, (now, 0))
            self._failed_since[name] = (since, count + 1)
            if count + 1 >= self._failures_to_down and name not in self._down:
                _log.warning("dependency %s is unreachable; the gateway advertises no capacity", name)
                self._down.add(name)
                self._outages[name].append(Outage(since))

    async def _probe(self, probe: HealthProbe) -> bool:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await probe.healthy(timeout_s=self._timeout_s)
        except TimeoutError:
            return False

    def start(self) -> None:
        """Start probing in the background (nothing to do without probes)."""
        if self._probes and self._task is None:
            self._task = asyncio.create_task(self._run(), name="dependency-monitor")

    async def stop(self) -> None:
        """Stop probing."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await self.probe_once()
            await asyncio.sleep(self._interval_s)
