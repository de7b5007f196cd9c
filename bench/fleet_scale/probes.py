"""What the fleet bench reads besides latencies: a process's CPU time and memory, and the database's growth."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

__all__ = ["DbSize", "ProcessSample", "db_size", "percentile", "sample_process"]

_TABLES = ("tasks", "sessions", "results", "reports", "deliveries", "gateways", "policy_versions")


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessSample:
    """CPU seconds (user + system) and resident memory of one process, at one moment."""

    cpu_s: float
    rss_mb: float


def sample_process(pid: int) -> ProcessSample:
    """Read ``/proc/PID`` (Linux): CPU time since start and current resident set size."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14 and 15 of stat)
    rss_kb = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    return ProcessSample(cpu, rss_kb / 1024)


@dataclasses.dataclass(frozen=True, slots=True)
class DbSize:
    """Rows (exact counts) and bytes on disk (with indexes and TOAST) of the rollout server's tables."""

    rows: int
    bytes: int


async def db_size(dsn: str) -> DbSize:
    """Count the rollout server's rows and measure its tables' total size in PostgreSQL."""
    import asyncpg  # type: ignore[import-untyped]

    conn = await asyncpg.connect(dsn)
    try:
        rows = 0
        for table in _TABLES:
            rows += int(await conn.fetchval(f"SELECT COUNT(*) FROM {table}"))
        size = await conn.fetchval("SELECT COALESCE(SUM(pg_total_relation_size(relid)), 0) FROM pg_stat_user_tables")
    finally:
        await conn.close()
    return DbSize(rows, int(size))


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]
