"""Benchmark dispatch: sessions scheduled per second onto no-op gateways (real gRPC, in process).

Each run submits one task of ``--sessions`` samples and measures the time until every session was persisted as
``starting``, StartSession was acknowledged by a gateway, and the session was persisted as ``running``. The fake
gateways accept each session and never finish it, so only scheduling is measured. Three modes run on the same
store, gateways and task shape in the same process:

* ``batched``: the real scheduler (one transaction per dispatch turn, concurrent StartSession calls);
* ``per-row commit``: the same scheduler over a store that commits every session update separately;
* ``serial`` (baseline): one session per turn, waiting for its StartSession before the next.

Run: ``.venv/bin/python -m bench.dispatch [--sessions N] [--gateways N] [--postgres]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from integration_tests.support.postgres import postgres_available, private_postgres
from rollout_server.clients import GrpcGatewayClient
from rollout_server.core import RolloutCore
from rollout_server.models import CoreConfig, GatewayRecord, NewTask, SchedulerConfig, SessionState
from rollout_server.scheduler import Scheduler
from rollout_server.store import SessionChange, open_store
from rollout_server.store.sql import SqlStore
from rollout_server.testing.fake_gateway import FakeGateway


class PerRowCommitStore(SqlStore):
    """The naive store: every session update is its own transaction."""

    async def update_sessions(self, changes: Sequence[SessionChange]) -> list[bool]:
        out: list[bool] = []
        for change in changes:
            out.extend(await super().update_sessions([change]))
        return out


async def _fresh_pg(dsn: str) -> str:
    import asyncpg  # type: ignore[import-untyped]

    name = f"bench_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    return dsn.rsplit("/", 1)[0] + f"/{name}"


async def run_mode(url: str, state_dir: Path, mode: str, sessions: int, gateways: Sequence[FakeGateway]) -> float:
    """Return sessions scheduled per second for one mode."""
    store = await open_store(url, state_dir)
    if mode == "per-row commit":
        store.__class__ = PerRowCommitStore
    client = GrpcGatewayClient(timeout_s=30)
    core = RolloutCore(store, client, CoreConfig(max_active_tasks=10**6))
    batch = 1 if mode == "serial" else 256
    scheduler = Scheduler(core, SchedulerConfig(dispatch_batch=batch))
    try:
        for g in gateways:
            g.held.clear()
            await core.register_gateway(GatewayRecord(g.gateway_id, g.address, sessions))
        task_id = f"bench-{uuid.uuid4().hex[:8]}"
        await core.submit_task(NewTask(task_id, b"\x12\x01x", task_id, sessions))
        start = time.perf_counter()
        started = 0
        while started < sessions:
            n = await scheduler.dispatch_once()
            if mode == "serial" or n == 0:
                await scheduler.wait_for_starts()
            started += n
        await scheduler.wait_for_starts()
        elapsed = time.perf_counter() - start
        states = {s.state for s in await store.task_sessions(task_id)}
        assert states == {SessionState.RUNNING}, states
        return sessions / elapsed
    finally:
        await scheduler.close()
        await core.close()
        await client.close()
        await store.close()


@contextlib.contextmanager
def _maybe_postgres(enabled: bool) -> Iterator[str | None]:
    if not enabled or not postgres_available():
        yield None
        return
    with private_postgres() as dsn:
        yield dsn


async def main_async(args: argparse.Namespace) -> list[dict[str, object]]:
    gateways = [await FakeGateway(f"gw{i}", capacity=10**6, delay_s=3600.0).start() for i in range(args.gateways)]
    for g in gateways:
        g.report = False
    rows: list[dict[str, object]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp, _maybe_postgres(args.postgres) as dsn:
            stores: list[tuple[str, str | None]] = [("sqlite", None)]
            if dsn is not None:
                stores.append(("postgresql", dsn))
            modes = ("serial", "per-row commit", "batched")
            for store_name, pg in stores:
                rates: dict[str, list[float]] = {m: [] for m in modes}
                # Modes alternate within each repetition so drifting machine load hits them alike.
                for rep in range(args.repeat):
                    for mode in modes:
                        url = await _fresh_pg(pg) if pg else f"sqlite:///{tmp}/{mode.replace(' ', '_')}-{rep}.sqlite3"
                        rates[mode].append(await run_mode(url, Path(tmp), mode, args.sessions, gateways))
                median = {m: sorted(r)[len(r) // 2] for m, r in rates.items()}
                for mode in modes:
                    rows.append(
                        {
                            "store": store_name,
                            "mode": mode,
                            "sessions_per_s": median[mode],
                            "vs_serial": median[mode] / median["serial"],
                        }
                    )
    finally:
        for g in gateways:
            await g.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dispatch", description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--gateways", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is reported")
    parser.add_argument("--postgres", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{args.sessions} sessions onto {args.gateways} no-op gRPC gateways (median of {args.repeat})\n")
    print("| store | mode | sessions/s | vs serial |")
    print("|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['store']} | {r['mode']} | {r['sessions_per_s']:,.0f} | {r['vs_serial']:.1f}x |")


if __name__ == "__main__":
    main()
