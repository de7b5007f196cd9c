"""SpareCores: whether the cores were idle over a short look (injected counts, then the real /proc/stat)."""

from __future__ import annotations

import os
import subprocess
import sys

from model_proxy.backends._spare_cores import SpareCores, read_busy_ticks


class _Counts:
    """Busy ticks per CPU that grow by ``step`` between two reads."""

    def __init__(self, step: dict[int, int]) -> None:
        self.step = step
        self.reads = 0

    def __call__(self) -> dict[int, int]:
        self.reads += 1
        return {cpu: 1000 + (self.reads - 1) * grow for cpu, grow in self.step.items()}


def _watch(counts: _Counts, cpus: list[int]) -> SpareCores:
    return SpareCores(cpus, window_s=0.04, read=counts, sleep=lambda s: None, ticks_per_s=100)


def test_idle_cores_and_busy_ones() -> None:
    assert _watch(_Counts({0: 0, 1: 0}), [0, 1]).idle()
    assert _watch(_Counts({0: 1, 1: 0}), [0, 1]).idle()  # 10 ms of 40: a quarter of one core, the limit
    assert not _watch(_Counts({0: 1, 1: 1}), [0, 1]).idle()
    assert not _watch(_Counts({0: 0, 1: 4}), [0, 1]).idle()  # one core busy the whole window


def test_only_the_watched_cpus_count() -> None:
    watch = _watch(_Counts({0: 0, 1: 0, 2: 4, 3: 4}), [0, 1])
    assert watch.count == 2
    assert watch.idle()


def test_a_recent_look_is_reused_and_an_old_one_taken_again() -> None:
    now = [0.0]
    counts = _Counts({0: 0, 1: 0})
    watch = SpareCores([0, 1], read=counts, sleep=lambda s: None, ticks_per_s=100, clock=lambda: now[0])
    assert watch.idle_lately(0.5)  # no look yet: looks
    assert counts.reads == 2
    counts.step = {0: 4, 1: 4}  # busy from now on
    now[0] = 0.4
    assert watch.idle_lately(0.5)  # the look of 0.4 s ago still stands
    assert counts.reads == 2
    now[0] = 0.5
    assert not watch.idle_lately(0.5)
    assert counts.reads == 4


def test_an_unreadable_proc_stat_means_busy() -> None:
    assert not SpareCores([0, 1], read=lambda: None, sleep=lambda s: None).idle()
    reads = iter([{0: 0, 1: 0}, None])
    assert not SpareCores([0, 1], read=lambda: next(reads), sleep=lambda s: None).idle()


def test_the_real_counts_cover_this_process_cpus() -> None:
    counts = read_busy_ticks()
    assert counts is not None
    assert set(os.sched_getaffinity(0)) <= set(counts)
    assert all(v >= 0 for v in counts.values())
    assert SpareCores().cpus == sorted(os.sched_getaffinity(0))


def test_a_busy_process_beside_makes_the_cores_busy() -> None:
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        watch = SpareCores(window_s=0.05)
        # The spinning process counts whichever of our CPUs it runs on (it inherits our affinity).
        assert [watch.idle() for _ in range(5)] == [False] * 5
    finally:
        spin.kill()
        spin.wait()
