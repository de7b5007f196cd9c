"""The processes of one fleet bench run: PostgreSQL, the rollout server, and the simulated gateway processes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

from integration_tests.support.postgres import fresh_database, private_postgres
from integration_tests.support.services import free_port, wait_serving

__all__ = ["Fleet", "FleetShape", "start_fleet"]


@dataclasses.dataclass(frozen=True, slots=True)
class FleetShape:
    """How many gateways, in how many processes, with how many session slots each."""

    gateways: int
    processes: int
    capacity: int
    median_s: float
    sigma: float
    max_s: float


@dataclasses.dataclass
class Fleet:
    """A running fleet: the rollout server's address and pid, the database, the gateway processes."""

    target: str
    server: asyncio.subprocess.Process
    dsn: str
    workers: list[asyncio.subprocess.Process]
    events: list[Path]
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    async def stop_gateways(self) -> list[dict[str, object]]:
        """SIGTERM the gateway processes and return their events (one dict per accepted attempt, per gateway)."""
        for worker in self.workers:
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                await asyncio.wait_for(worker.wait(), 60)
            except TimeoutError:
                worker.kill()
                await worker.wait()
        self.workers = []
        out: list[dict[str, object]] = []
        for path in self.events:
            if path.exists():
                out.extend(json.loads(line) for line in path.read_text().splitlines() if line)
        return out


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    env["no_proxy"] = env["NO_PROXY"] = "*"  # every address here is local
    return env


@contextlib.asynccontextmanager
async def start_fleet(shape: FleetShape, root: Path) -> AsyncIterator[Fleet]:
    """Start PostgreSQL, ``polar serve rollout`` on it, then the gateway processes; stop them all on exit."""
    with private_postgres() as admin_dsn:
        dsn = await fresh_database(admin_dsn)
        port = free_port()
        env = _env()
        env["POLAR_ROLLOUT_STORE_URL"] = dsn
        log = root / "rollout.log"
        state = root / "rollout"
        state.mkdir()
        argv = [sys.executable, "-m", "polar_run", "serve", "rollout", "--state-dir", str(state)]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        with log.open("ab") as out:
            server = await asyncio.create_subprocess_exec(
                *argv, env=env, stdout=out, stderr=asyncio.subprocess.STDOUT, start_new_session=True
            )
        fleet = Fleet(f"127.0.0.1:{port}", server, dsn, [], [], log)
        try:
            await wait_serving(
                fleet.target, "rollout", time.monotonic() + 120, fleet.log_tail, exited=lambda: server.returncode
            )
            per = -(-shape.gateways // shape.processes)
            for first in range(0, shape.gateways, per):
                events = root / f"gateways-{first}.jsonl"
                argv = [sys.executable, "-m", "bench.fleet_scale.gateways", "--rollout", fleet.target]
                argv += ["--first", str(first), "--count", str(min(per, shape.gateways - first))]
                argv += ["--capacity", str(shape.capacity), "--events", str(events), "--seed", str(first)]
                argv += ["--median-s", str(shape.median_s), "--sigma", str(shape.sigma), "--max-s", str(shape.max_s)]
                worker = await asyncio.create_subprocess_exec(
                    *argv, env=_env(), stdout=asyncio.subprocess.PIPE, start_new_session=True
                )
                fleet.workers.append(worker)
                fleet.events.append(events)
            for worker in fleet.workers:
                assert worker.stdout is not None
                line = await asyncio.wait_for(worker.stdout.readline(), 300)
                if line.strip() != b"ready":
                    raise RuntimeError(f"a gateway process did not start (exit {worker.returncode})")
            yield fleet
        finally:
            for worker in fleet.workers:
                with contextlib.suppress(ProcessLookupError):
                    worker.kill()
                await worker.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(server.wait(), 30)
            except TimeoutError:
                os.killpg(server.pid, signal.SIGKILL)
                await server.wait()
