"""Whether the cores this process may use are idle right now, read from ``/proc/stat``.

The ``llama_cpp`` backend decodes on one core less than it may use, because llama.cpp's threads spin-wait for
each other: a thread whose core another process takes stalls every operation (a 1,500-token call took 14x
longer on 2 threads beside one busy process). A prompt's prefill is ~1.7x and decoding ~1.5x faster on both cores
of a 2-core machine, so the backend looks at the cores for a moment (:meth:`SpareCores.idle`: before each
prefill step, and at most every half second while decoding) and takes them all only while nobody else uses them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Mapping

__all__ = ["SpareCores", "read_busy_ticks"]

_BUSY_SHARE = 0.25  # of one core, all of our CPUs together, over the window: above it, something else runs


def read_busy_ticks() -> dict[int, int] | None:
    """Busy clock ticks of each CPU since boot (``/proc/stat``: all but idle and iowait); None when unreadable."""
    try:
        with open("/proc/stat", "rb") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    out: dict[int, int] = {}
    for line in lines:
        if not line.startswith(b"cpu") or line[3:4] in (b" ", b""):
            continue  # the aggregate line, or other counters
        name, *fields = line.split()
        try:
            values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            out[int(name[3:])] = sum(values) - values[3] - values[4]
        except (ValueError, IndexError):
            return None
    return out or None


class SpareCores:
    """Looks at a set of CPUs for a short window and says whether they were idle."""

    def __init__(
        self,
        cpus: Collection[int] | None = None,
        *,
        window_s: float = 0.04,
        read: Callable[[], Mapping[int, int] | None] = read_busy_ticks,
        sleep: Callable[[float], None] = time.sleep,
        ticks_per_s: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Watch ``cpus`` (default: the CPUs this process may run on).

        Args:
            cpus: CPU numbers.
            window_s: How long :meth:`idle` looks.
            read: Busy ticks per CPU (tests inject one).
            sleep: Waits ``window_s`` (tests inject one).
            ticks_per_s: Clock ticks per second of ``read``'s counts (default ``SC_CLK_TCK``).
            clock: Monotonic seconds, for :meth:`idle_lately` (tests inject one).
        """
        self.cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
        self._window = window_s
        self._read = read
        self._sleep = sleep
        self._hz = ticks_per_s or os.sysconf("SC_CLK_TCK")
        self._clock = clock
        self._last: tuple[float, bool] | None = None  # when the last look ended, and what it saw

    @property
    def count(self) -> int:
        """How many CPUs are watched."""
        return len(self.cpus)

    def idle(self) -> bool:
        """Whether the CPUs together were busy less than a quarter of one core over the next ``window_s``.

        Blocks for the window. False when ``/proc/stat`` cannot be read (the safe answer).
        """
        before = self._read()
        if before is None:
            self._last = (self._clock(), False)
            return False
        self._sleep(self._window)
        after = self._read()
        if after is None:
            self._last = (self._clock(), False)
            return False
        busy = sum(after[c] - before[c] for c in self.cpus if c in before and c in after)
        idle = busy / self._hz <= _BUSY_SHARE * self._window
        self._last = (self._clock(), idle)
        return idle

    def idle_lately(self, max_age_s: float) -> bool:
        """What the last look saw when it ended less than ``max_age_s`` ago; else :meth:`idle`."""
        if self._last is not None and self._clock() - self._last[0] < max_age_s:
            return self._last[1]
        return self.idle()
