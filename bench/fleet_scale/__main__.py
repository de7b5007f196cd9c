"""Benchmark the control plane at fleet scale: the real rollout server on PostgreSQL, simulated gateways, trainers.

The rollout server runs as ``polar serve rollout`` (its own process) on a private PostgreSQL. ``--gateways``
simulated gateways (real GatewayService gRPC servers, in ``--processes`` processes: see
:mod:`bench.fleet_scale.gateways`) register and heartbeat, accept StartSession, "run" each session for a
lognormal time and report results of real size through ReportSessionResultStream. The trainer (this process)
submits tasks of ``--group`` samples and watches each with WatchTask.

Phases, on the same server and fleet:

* ``baseline``: the first active level with 2-token results (no payload): the reference of the ratio columns;
* one phase per ``--levels`` value N: N sessions kept active (a new group submitted as soon as a group's worth
  of results reached the trainer) for ``--window-s``, with results of real size (one merged trace of
  ``--small-tokens`` response tokens, or for ``--large-fraction`` of them a 60-call trace set of ~3 MB);
* ``queued``: ``--queued`` sessions submitted at once in tasks of ``--queued-task``; the fleet runs at its
  capacity under that backlog for ``--window-s`` and the phase ends (quick mode: the backlog is drained, and
  every session must end once; full mode: "lost" does not apply, duplicates are still counted).

Per phase: sessions/s reaching the trainer; submit -> StartSession acknowledged p50/p99 (sessions submitted
after the ramp; not meaningful under a backlog); gateway report -> trainer p50/p99; the rollout server's CPU ms
per session (its process's user + system time over the phase, heartbeats and watchers included) and resident
memory (peak); PostgreSQL rows and KB added per session; attempts per session; sessions lost or delivered twice
(both must be 0). Under the table: CPU per MB of result (mixed phase minus baseline), RSS with the backlog over
idle, the targets of issue 22, and with ``--profile PHASE`` the rollout server's hottest functions (py-spy).

Run: ``.venv/bin/python -m bench.fleet_scale`` (full: 128 gateways, 256/1,024/4,096 active, 100k queued) or
``--quick`` (8 gateways, 16/64 active, 512 queued: what CI runs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from polar.rollout.v1 import rollout_service_pb2_grpc

from bench.fleet_scale.fleet import Fleet, FleetShape, start_fleet
from bench.fleet_scale.probes import db_size, sample_process
from bench.fleet_scale.report import PhaseRecord, Row, check, profile_summary, rows
from bench.fleet_scale.trainer import Trainer, Workload
from polar_core.channels import open_channel


@contextlib.asynccontextmanager
async def _peak_rss(pid: int) -> AsyncIterator[Callable[[], float]]:
    """Sample the process's RSS every 0.5 s while the block runs; yield a reader of the peak so far."""
    peak = sample_process(pid).rss_mb

    async def sampler() -> None:
        nonlocal peak
        while True:
            await asyncio.sleep(0.5)
            peak = max(peak, sample_process(pid).rss_mb)

    task = asyncio.create_task(sampler())
    try:
        yield lambda: peak
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def _profiled(pid: int, out: Path | None, seconds: float) -> AsyncIterator[None]:
    """Record the process with py-spy (raw collapsed stacks to ``out``) while the block runs, if ``out``."""
    spy = Path(sys.executable).parent / "py-spy"
    if out is None or not spy.exists():
        yield
        return
    argv = [str(spy), "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--rate", "20"]
    argv += ["--format", "raw", "--output", str(out), "--nonblocking"]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    try:
        yield
    finally:
        try:
            await asyncio.wait_for(proc.wait(), seconds + 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def _phase(
    fleet: Fleet,
    trainer: Trainer,
    args: argparse.Namespace,
    name: str,
    active: int,
    workload: Workload,
    queued: int = 0,
) -> PhaseRecord:
    pid = fleet.server.pid
    profile = Path(args.out) / f"profile-{name}.txt" if args.profile == name else None
    db_before = await db_size(fleet.dsn)
    before = sample_process(pid)
    start = time.monotonic()
    prefix = f"{name}"
    async with _peak_rss(pid) as peak, _profiled(pid, profile, args.window_s):
        queued_rss = 0.0
        if queued:
            await trainer.backlog(prefix, queued, args.queued_task, workload)
            queued_rss = sample_process(pid).rss_mb
            ramped = time.time()
            await asyncio.sleep(args.window_s)
        else:
            ramped = await trainer.closed_loop(prefix, active, args.group, args.window_s, workload)
        # A full-size backlog is not waited for (hours of sessions): the phase ends after its window.
        partial = bool(queued) and not args.quick
        drained = partial or await trainer.drain(args.drain_s)
        rss = peak()
    wall = time.monotonic() - start
    after = sample_process(pid)
    return PhaseRecord(
        name=name,
        prefix=prefix,
        gateways=args.gateways,
        active=active,
        queued=queued,
        ramped_at=ramped,
        wall_s=wall,
        cpu_s=after.cpu_s - before.cpu_s,
        rss_mb=rss,
        db_before=db_before,
        db_after=await db_size(fleet.dsn),
        load=os.getloadavg()[0],
        drained=drained,
        partial=partial,
        queued_rss_mb=queued_rss,
    )


async def run(args: argparse.Namespace) -> tuple[list[Row], dict[str, object]]:
    shape = FleetShape(
        args.gateways, args.processes, args.capacity, args.median_s, args.sigma, args.median_s * args.max_factor
    )
    mixed = Workload(args.median_s, args.sigma, args.large_fraction, args.small_tokens)
    tiny = dataclasses.replace(mixed, large_fraction=0.0, small_tokens=0)
    extra: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp:
        root = Path(tmp)
        args.out = args.out or tmp
        async with start_fleet(shape, root) as fleet:
            channel = open_channel(fleet.target)
            trainer = Trainer(rollout_service_pb2_grpc.RolloutServiceStub(channel))  # type: ignore[arg-type]
            records: list[PhaseRecord] = []
            try:
                await asyncio.sleep(args.settle_s)  # every gateway heartbeats at least once
                idle = sample_process(fleet.server.pid)
                extra["idle_rss_mb"] = idle.rss_mb
                records.append(await _phase(fleet, trainer, args, "baseline", args.levels[0], tiny))
                for level in args.levels:
                    records.append(await _phase(fleet, trainer, args, str(level), level, mixed))
                if args.queued:
                    records.append(await _phase(fleet, trainer, args, "queued", 0, mixed, queued=args.queued))
                extra["undrained"] = [r.name for r in records if not r.drained]
                extra["queued_rss_mb"] = max((r.queued_rss_mb for r in records), default=0.0)
            finally:
                await trainer.close()
                events = await fleet.stop_gateways()
                await channel.close(None)
            extra["problems"] = check(trainer, events, [r.prefix for r in records if r.partial])
            extra["refused"] = sum(int(str(e.get("refused", 0))) for e in events)
            extra["statuses"] = dict(trainer.statuses)
            if args.profile and (path := Path(args.out) / f"profile-{args.profile}.txt").exists():
                extra["profile"] = profile_summary(path)
            return rows(records, trainer, events), extra


def _ratio(value: float, base: float) -> str:
    if not (math.isfinite(value) and math.isfinite(base)) or base <= 0:
        return "—"
    return f"{value / base:.1f}x"


def _ms(value: float) -> str:
    return "—" if not math.isfinite(value) else f"{value:,.0f}"


def print_table(table: list[Row], extra: dict[str, object], args: argparse.Namespace) -> None:
    base = table[0]
    print(
        f"rollout server (polar serve rollout, PostgreSQL 15) with {args.gateways} simulated gateways in "
        f"{args.processes} processes, sessions lognormal (median {args.median_s:g} s, sigma {args.sigma:g}), "
        f"{args.large_fraction:.0%} of results a 60-call trace set; {os.cpu_count()} CPUs\n"
    )
    print(
        "| phase | active | queued | sessions | sessions/s | dispatch p50/p99 ms | report→trainer p50/p99 ms "
        "| server CPU ms/session | vs baseline | MB/session | server RSS MB | PG rows/session | PG KB/session "
        "| attempts/session | lost | twice | load avg |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in table:
        print(
            f"| {r.phase} | {r.active:,} | {r.queued:,} | {r.sessions:,} | {r.per_s:,.1f} "
            f"| {_ms(r.dispatch_p50_ms)} / {_ms(r.dispatch_p99_ms)} "
            f"| {_ms(r.deliver_p50_ms)} / {_ms(r.deliver_p99_ms)} "
            f"| {r.cpu_ms:.1f} | {_ratio(r.cpu_ms, base.cpu_ms)} | {r.mb:.2f} | {r.rss_mb:,.0f} | {r.db_rows:.1f} "
            f"| {r.db_kb:,.1f} | {r.attempts:.2f} | {'—' if r.lost < 0 else r.lost} | {r.twice} | {r.load:.1f} |"
        )
    mixed = table[1] if len(table) > 1 else base
    per_mb = (mixed.cpu_ms - base.cpu_ms) / (mixed.mb - base.mb) if mixed.mb > base.mb else float("nan")
    idle = float(str(extra["idle_rss_mb"]))
    print(f"\nserver CPU per MB of result: {per_mb:.1f} ms ({mixed.phase} minus baseline)")
    print(f"server RSS idle (fleet registered, nothing submitted): {idle:,.0f} MB")
    queued = [r for r in table if r.queued]
    if queued:
        q, after = queued[0], float(str(extra["queued_rss_mb"]))
        print(
            f"server RSS right after {q.queued:,} were queued: {after:,.0f} MB (+{after - idle:,.0f} over idle); "
            f"peak while the backlog ran: {q.rss_mb:,.0f} MB"
        )
    print(f"StartSession refused (gateway full): {extra['refused']}; terminal statuses: {extra['statuses']}")
    problems = list(extra["problems"])  # type: ignore[call-overload]
    problems += [f"phase {p} did not drain in {args.drain_s:g} s" for p in extra["undrained"]]  # type: ignore[attr-defined]
    print(
        "exactly once: "
        + ("every session ended once, none lost or delivered twice" if not problems else "; ".join(problems))
    )
    at = [r for r in table if r.phase == "1024"]
    if at and math.isfinite(per_mb):
        r = at[0]
        cpu = r.cpu_ms - per_mb * r.mb
        print(
            f"targets at 1,024 active: dispatch p99 {_ms(r.dispatch_p99_ms)} ms (≤ 200), report→trainer p99 "
            f"{_ms(r.deliver_p99_ms)} ms (≤ 500), CPU {cpu:.1f} ms/session without payload (≤ 5)"
        )
    if extra.get("profile"):
        print(f"\nrollout server profile during phase {args.profile} (py-spy, share of samples):\n")
        print("| function | inclusive | own |")
        print("|---|---:|---:|")
        for fn, inc, own in extra["profile"]:  # type: ignore[attr-defined]
            print(f"| `{fn}` | {inc:.1f}% | {own:.1f}% |")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_scale", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI size: 8 gateways, 16/64 active, 512 queued")
    parser.add_argument("--gateways", type=int)
    parser.add_argument("--processes", type=int, help="gateway processes")
    parser.add_argument("--capacity", type=int, help="sessions per gateway (default: largest level / gateways)")
    parser.add_argument(
        "--levels", type=lambda s: [int(x) for x in s.split(",")], help="active sessions, e.g. 256,1024"
    )
    parser.add_argument("--queued", type=int, help="sessions submitted at once for the backlog phase (0: none)")
    parser.add_argument("--queued-task", type=int, default=1000, help="samples per task of the backlog")
    parser.add_argument("--group", type=int, default=8, help="samples per task in the active phases")
    parser.add_argument("--window-s", type=float, help="seconds each phase keeps its level")
    parser.add_argument("--drain-s", type=float, help="most seconds to wait for a phase's sessions")
    parser.add_argument("--median-s", type=float, help="median simulated session seconds")
    parser.add_argument("--sigma", type=float, default=0.8, help="lognormal sigma of session seconds")
    parser.add_argument("--max-factor", type=float, help="longest session, in medians")
    parser.add_argument("--large-fraction", type=float, default=0.05, help="results that are a 60-call trace set")
    parser.add_argument("--small-tokens", type=int, default=8000, help="response tokens of an ordinary result")
    parser.add_argument("--settle-s", type=float, default=6.0, help="idle seconds before the first phase")
    parser.add_argument("--profile", default="", help="py-spy the rollout server during this phase (e.g. 4096)")
    parser.add_argument("--out", default="", help="directory for profiles (default: the run's temporary one)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = parser.parse_args()
    quick: dict[str, object] = {"gateways": 8, "processes": 2, "levels": [16, 64], "queued": 512, "window_s": 6.0}
    quick.update(median_s=0.5, max_factor=6.0, drain_s=180.0)
    # The full defaults are the run in docs/scale.md.
    full: dict[str, object] = {"gateways": 128, "processes": 4, "levels": [256, 1024, 4096], "queued": 100_000}
    full.update(window_s=45.0, median_s=30.0, max_factor=3.0, drain_s=300.0)
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.quick:
        args.queued_task = min(args.queued_task, 128)
        args.settle_s = min(args.settle_s, 2.0)
    if args.capacity is None:
        args.capacity = -(-max(args.levels) // args.gateways)
    # SIGTERM (a test's timeout) unwinds like Ctrl-C, so PostgreSQL, the server and the gateways are stopped.
    signal.signal(signal.SIGTERM, _interrupt)
    table, extra = asyncio.run(run(args))
    if args.json:
        print(json.dumps({"rows": [dataclasses.asdict(r) for r in table], **extra}, indent=2, default=str))
        return
    print_table(table, extra, args)


if __name__ == "__main__":
    main()
