"""The workspace disk quota where no file system of its own can be mounted: a watchdog over allocated disk.

Started as root, the runtimes give a session an image of its quota's size (:mod:`runtimes._diskimage`), which
refuses the write past it. Without root no host offers a per-directory quota (project quotas need XFS/ext4
mounted with ``prjquota`` and ``CAP_SYS_ADMIN``; a loop mount needs root), so there: while a command runs, a watchdog
sums the *allocated* blocks (``st_blocks``, so a sparse file counts what it really occupies, not its apparent
size) below the session directory, hard links once, symlinks never followed. Over the quota, the runtime kills
the sandbox's processes and the command raises :class:`runtimes.errors.DiskQuotaExceeded`; every later command
of that runtime raises it too. Between two samples a writer can overshoot by what it writes in one interval,
each file bounded by the per-file size limit (``RLIMIT_FSIZE``).

The interval adapts to the cost of a walk (never more than about a tenth of one core on measuring).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["MIN_INTERVAL_S", "allocated_bytes", "quota_message", "watch_quota"]

_T = TypeVar("_T")

MIN_INTERVAL_S = 0.25
"""The shortest time between two measurements."""
_MAX_INTERVAL_S = 5.0
# A walk may take at most this share of the time between walks.
_DUTY = 0.1


def allocated_bytes(root: Path, *, stop_above: int | None = None) -> int:
    """Bytes allocated on disk below ``root`` (``st_blocks * 512``), each inode once, symlinks not followed.

    Args:
        root: The directory to measure; a missing one measures 0.
        stop_above: Stop walking once the sum exceeds this (the answer is then only known to be larger).
    """
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [str(root)]
    while stack:
        directory = stack.pop()
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed while we walked
                key = (info.st_dev, info.st_ino)
                if key in seen:
                    continue
                seen.add(key)
                total += info.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
        if stop_above is not None and total > stop_above:
            break
    return total


def quota_message(used: int, limit: int, what: str) -> str:
    """The reason a session ends with when ``what`` used ``used`` bytes of a ``limit``-byte quota."""
    return f"{what} used more than its disk quota (over {used // 2**20} MiB allocated, quota {limit // 2**20} MiB)"


async def watch_quota(
    work: Awaitable[_T],
    *,
    measure: Callable[[], Awaitable[int]],
    limit: int,
    on_exceeded: Callable[[int], Awaitable[None]],
) -> tuple[_T, int | None]:
    """Run ``work`` while measuring usage; over ``limit``, call ``on_exceeded`` (which must end ``work``).

    Args:
        work: The command to watch.
        measure: Returns the bytes in use now.
        limit: The quota in bytes.
        on_exceeded: Kills the sandbox's processes, given the usage that broke the quota.

    Returns:
        The result of ``work`` and the usage that broke the quota (``None`` when it held).
    """
    task = asyncio.ensure_future(work)
    breach: int | None = None
    interval = MIN_INTERVAL_S
    try:
        while True:
            await asyncio.wait({task}, timeout=interval)
            # Measured once more after the command ends: a burst between two samples is still caught.
            started = time.monotonic()
            used = await measure()
            if used > limit:
                breach = used
                await on_exceeded(used)
                break
            if task.done():
                break
            interval = min(max(MIN_INTERVAL_S, (time.monotonic() - started) / _DUTY), _MAX_INTERVAL_S)
        return await task, breach
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
