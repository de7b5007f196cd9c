"""Turn one fleet run's records (trainer times, gateway events, process and database samples) into table rows."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from pathlib import Path

from bench.fleet_scale.probes import DbSize, percentile
from bench.fleet_scale.trainer import Trainer

__all__ = ["PhaseRecord", "Row", "check", "profile_summary", "rows"]


@dataclasses.dataclass
class PhaseRecord:
    """What the driver saw during one phase."""

    name: str
    prefix: str
    gateways: int
    active: int
    queued: int
    ramped_at: float
    wall_s: float
    cpu_s: float
    rss_mb: float
    db_before: DbSize
    db_after: DbSize
    load: float
    drained: bool
    partial: bool = False
    queued_rss_mb: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One line of the table."""

    phase: str
    gateways: int
    active: int
    queued: int
    sessions: int
    per_s: float
    dispatch_p50_ms: float
    dispatch_p99_ms: float
    deliver_p50_ms: float
    deliver_p99_ms: float
    cpu_ms: float
    mb: float
    rss_mb: float
    db_rows: float
    db_kb: float
    attempts: float
    lost: int
    twice: int
    load: float


def _attempts(events: list[dict[str, object]]) -> dict[str, list[dict[str, object]]]:
    by_session: dict[str, list[dict[str, object]]] = defaultdict(list)
    for e in events:
        if "session" in e:
            by_session[str(e["session"])].append(e)
    return by_session


def rows(records: list[PhaseRecord], trainer: Trainer, events: list[dict[str, object]]) -> list[Row]:
    """One row per phase; latencies in ms, CPU in ms of the rollout server per session, sizes per session."""
    attempts = _attempts(events)
    out: list[Row] = []
    for rec in records:
        ids = [s for s in trainer.submitted_at if s.startswith(rec.prefix + "-")]
        n = max(1, len(ids))
        dispatch: list[float] = []
        deliver: list[float] = []
        size = 0
        tries = 0
        for sid in ids:
            tried = attempts.get(sid, [])
            tries += len(tried)
            submitted = trainer.submitted_at[sid]
            if tried and submitted >= rec.ramped_at and not rec.queued:
                dispatch.append(min(float(str(a["ack"])) for a in tried) - submitted)
            for a in tried:
                if float(str(a["reported_at"])) and not a["duplicate"]:
                    size += int(str(a["bytes"]))
                    if sid in trainer.received_at:
                        deliver.append(trainer.received_at[sid] - float(str(a["report_at"])))
        # A backlog not waited for: CPU and MB per session that finished; PG and attempts per queued session.
        done = max(1, len(deliver)) if rec.partial else n
        out.append(
            Row(
                phase=rec.name,
                gateways=rec.gateways,
                active=rec.active,
                queued=rec.queued,
                sessions=len(ids),
                per_s=len(deliver) / rec.wall_s if rec.wall_s else 0.0,
                dispatch_p50_ms=percentile(dispatch, 0.5) * 1000,
                dispatch_p99_ms=percentile(dispatch, 0.99) * 1000,
                deliver_p50_ms=percentile(deliver, 0.5) * 1000,
                deliver_p99_ms=percentile(deliver, 0.99) * 1000,
                cpu_ms=rec.cpu_s * 1000 / done,
                mb=size / 1e6 / done,
                rss_mb=rec.rss_mb,
                db_rows=(rec.db_after.rows - rec.db_before.rows) / n,
                db_kb=(rec.db_after.bytes - rec.db_before.bytes) / 1024 / n,
                attempts=tries / n,
                lost=-1 if rec.partial else sum(1 for s in ids if trainer.deliveries[s] == 0),
                twice=sum(1 for s in ids if trainer.deliveries[s] > 1),
                load=rec.load,
            )
        )
    return out


def check(trainer: Trainer, events: list[dict[str, object]], partial: list[str]) -> list[str]:
    """Whatever broke the exactly-once rule: sessions never seen, seen twice, or a result recorded twice.

    Sessions of ``partial`` phases (prefixes) were not waited for, so only duplicates count there.
    """
    problems: list[str] = []
    waited = [s for s in trainer.submitted_at if not any(s.startswith(p + "-") for p in partial)]
    lost = [s for s in waited if trainer.deliveries[s] == 0]
    twice = [s for s, c in trainer.deliveries.items() if c > 1]
    unknown = [s for s in trainer.deliveries if s not in trainer.submitted_at]
    if lost:
        problems.append(f"{len(lost)} sessions never reached the trainer (e.g. {lost[:3]})")
    if twice:
        problems.append(f"{len(twice)} sessions reached the trainer more than once (e.g. {twice[:3]})")
    if unknown:
        problems.append(f"{len(unknown)} results for sessions never submitted")
    recorded = Counter(str(e["session"]) for e in events if "session" in e and e["reported_at"] and not e["duplicate"])
    double = [s for s, c in recorded.items() if c > 1]
    if double:
        problems.append(f"{len(double)} sessions had two results accepted (e.g. {double[:3]})")
    return problems


def profile_summary(path: Path, top: int = 15) -> list[tuple[str, float, float]]:
    """Summarize py-spy's raw (collapsed) stacks: ``(function, inclusive %, own %)``, by inclusive share."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [f.strip() for f in stack.split(";") if f.strip()]
        for frame in set(frames):
            inclusive[frame] += count
        if frames:
            own[frames[-1]] += count
    total = max(total, 1)
    interesting = [
        f for f in inclusive if any(k in f for k in ("rollout_server", "polar_core", "asyncpg", "grpc", "protobuf"))
    ]
    ranked = sorted(interesting, key=lambda f: -inclusive[f])[:top]
    return [(f, 100 * inclusive[f] / total, 100 * own[f] / total) for f in ranked]
