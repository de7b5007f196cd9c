"""Several hosts: PostgreSQL, the rollout server and two gateway hosts, each in its own network namespace.

Topology (set up by the ``cluster`` fixture, torn down even on failure)::

    root netns (this test: client, trainer callback)  10.213.N.1 ─┐
    polar-<tag>-db       PostgreSQL 15 (private initdb)  10.213.N.10 ├─ bridge in polar-<tag>-hub
    polar-<tag>-ro       polar serve rollout (PostgreSQL)  10.213.N.20 │
    polar-<tag>-g1/g2    polar serve gateway + proxy + reconstructor + evaluator  10.213.N.31/.32 ─┘

Every service is a real ``polar serve`` subprocess started with ``ip netns exec``; gateways are configured
statically (``POLAR_ROLLOUT_GATEWAY_ADDRESSES``) and report results to the rollout server. The agent is the
``command`` harness: a Python script making two chat calls through its host's proxy, then sleeping.

The test kills gateway 1 (SIGKILL) while its sessions run, so they end ``infra_error`` and are retried on gateway
2; then it kills the rollout server (SIGKILL) while retried sessions run and restarts it on the same database.
The task completes with exactly one result per session, a watcher spanning the restart sees every result once,
and the deduplicating trainer callback records exactly one effect per session.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import grpc
import pytest
from polar.common.v1 import session_pb2, status_pb2, task_pb2
from polar.gateway.v1 import gateway_service_pb2, gateway_service_pb2_grpc
from polar.rollout.v1 import trainer_callback_service_pb2, trainer_callback_service_pb2_grpc

from integration_tests.support.postgres import PG_BIN, postgres_available
from integration_tests.support.services import CHAT_AGENT, Service, ServiceProcesses
from polar_client import RolloutClient
from polar_core.channels import open_channel
from polar_core.server import ServiceRegistration, start_grpc_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(sys.platform != "linux", reason="network namespaces are Linux-only"),
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for the workspace"),
    pytest.mark.skipif(shutil.which("python3") is None, reason="the agent script needs python3 on PATH"),
    pytest.mark.skipif(not postgres_available(), reason="PostgreSQL 15 binaries are not installed"),
]

TOKEN = "multihost-control-plane-token"
TASK_ID = "mh"
SAMPLES = 6
PER_GATEWAY = 3
AGENT_PAUSE_S = 3.0
GRPC_PORT = 50051
PROXY_PORT, PROXY_HTTP_PORT, RECONSTRUCTOR_PORT, EVALUATOR_PORT = 50052, 8080, 50053, 50054


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _netns_permitted() -> str | None:
    """Return why network namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    probe = f"polar-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        return f"'ip netns add' is not permitted: {getattr(exc, 'stderr', b'').decode(errors='replace').strip()}"
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("netns", "del", probe)
    return None


def _free_subnet() -> str:
    """A 10.213.N.0/24 prefix ("10.213.N") that nothing in this network namespace routes yet."""
    routes = subprocess.run(["ip", "-4", "route"], check=True, capture_output=True, text=True).stdout
    candidates = [n for n in range(256) if f"10.213.{n}." not in routes]
    if not candidates:
        pytest.skip("no free 10.213.N.0/24 subnet")
    return f"10.213.{random.choice(candidates)}"


@dataclasses.dataclass
class Cluster:
    """The namespaces, addresses and processes of one test run."""

    tag: str
    subnet: str
    root: Path
    pg_dir: Path
    netns: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.procs = ServiceProcesses(self.root)

    def ns(self, host: str) -> str:
        return f"polar-{self.tag}-{host}"

    def addr(self, last_octet: int) -> str:
        return f"{self.subnet}.{last_octet}"

    @property
    def client_addr(self) -> str:
        return self.addr(1)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@{self.addr(10)}:5432/postgres"

    @property
    def rollout_target(self) -> str:
        return f"{self.addr(20)}:{GRPC_PORT}"

    def gateway_addr(self, index: int) -> str:
        return self.addr(30 + index)

    # Processes ----------------------------------------------------------------------------------------------
    def serve(self, key: str, host: str, service: str, address: str, port: int, env: Mapping[str, str]) -> Service:
        """Start ``polar serve SERVICE`` in host ``host``'s namespace, in a process group of its own."""
        return self.procs.serve(key, service, address, port, env, prefix=["ip", "netns", "exec", self.ns(host)])

    def kill(self, key: str) -> None:
        """SIGKILL a service's whole process group (a crash: no graceful shutdown) and reap it."""
        self.procs.kill(key)

    def logs(self) -> str:
        """The tail of every service's log, for assertion messages."""
        return self.procs.logs()

    async def wait_healthy(self, keys: list[str], limit_s: float = 90.0) -> None:
        """Wait until every named service answers its gRPC health check (from this namespace, over the bridge)."""
        await self.procs.wait_healthy(keys, limit_s)

    # Network and database -----------------------------------------------------------------------------------
    def add_host(self, host: str, last_octet: int) -> None:
        """Create namespace ``host`` with ``eth0`` (10.213.N.last_octet/24) plugged into the hub's bridge."""
        ns = self.ns(host)
        _ip("netns", "add", ns)
        self.netns.append(ns)
        outer, inner = f"pv{self.tag}{host}h", f"pv{self.tag}{host}n"
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", outer, "netns", self.ns("hub"))
        _ip("link", "set", inner, "netns", ns)
        _ip("-n", self.ns("hub"), "link", "set", outer, "master", "br0", "up")
        _ip("-n", ns, "link", "set", inner, "name", "eth0")
        _ip("-n", ns, "addr", "add", f"{self.addr(last_octet)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")

    def build_network(self) -> None:
        hub = self.ns("hub")
        _ip("netns", "add", hub)
        self.netns.append(hub)
        _ip("-n", hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", hub, "link", "set", "br0", "up")
        _ip("-n", hub, "link", "set", "lo", "up")
        # This (the test's) namespace joins with a veth pair whose root end carries 10.213.N.1.
        here, there = f"pv{self.tag}root", f"pv{self.tag}rhub"
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", hub)
        _ip("-n", hub, "link", "set", there, "master", "br0", "up")
        _ip("addr", "add", f"{self.client_addr}/24", "dev", here)
        _ip("link", "set", here, "up")
        for host, octet in (("db", 10), ("ro", 20), ("g1", 31), ("g2", 32)):
            self.add_host(host, octet)

    def _pg_ctl(self, *args: str) -> list[str]:
        """``pg_ctl`` run as user ``postgres`` inside the db host's namespace."""
        as_postgres = ["runuser", "-u", "postgres", "--"]
        return [
            "ip",
            "netns",
            "exec",
            self.ns("db"),
            *as_postgres,
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.pg_data),
            *args,
        ]

    @property
    def pg_data(self) -> Path:
        return self.pg_dir / "data"

    def start_postgres(self) -> None:
        """A private initdb run as user ``postgres``, listening on the db host's address only."""
        initdb = ["runuser", "-u", "postgres", "--", str(PG_BIN / "initdb"), "-D", str(self.pg_data), "-U", "postgres"]
        subprocess.run([*initdb, "-A", "trust"], check=True, capture_output=True, timeout=120)
        with (self.pg_data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.subnet}.0/24 trust\n")
        options = f"-p 5432 -k {self.pg_dir} -c listen_addresses={self.addr(10)} -c fsync=off -c max_connections=100"
        start = self._pg_ctl("-o", options, "-l", str(self.pg_dir / "log"), "-w", "start")
        subprocess.run(start, check=True, capture_output=True, timeout=120)

    def teardown(self) -> None:
        self.procs.kill_all()
        if (self.pg_data / "postmaster.pid").exists():
            subprocess.run(self._pg_ctl("-m", "immediate", "stop"), capture_output=True, timeout=60, check=False)
        # Anything still alive in our namespaces (orphaned agent sandboxes, ...) is ours: end it by pid.
        for ns in self.netns:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False).stdout
            for pid in pids.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        for ns in reversed(self.netns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", f"pv{self.tag}root"], capture_output=True, check=False)
        shutil.rmtree(self.pg_dir, ignore_errors=True)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    reason = _netns_permitted()
    if reason is not None:
        pytest.skip(reason)
    pg_dir = Path(tempfile.mkdtemp(prefix="polar-mh-pg-"))
    shutil.chown(pg_dir, "postgres")
    c = Cluster(tag=f"{os.getpid() % 0xFFFF:04x}", subnet=_free_subnet(), root=tmp_path, pg_dir=pg_dir)
    try:
        c.build_network()
        c.start_postgres()
        yield c
    finally:
        c.teardown()


# Services ---------------------------------------------------------------------------------------------------
def rollout_env(c: Cluster) -> dict[str, str]:
    return {
        "POLAR_ROLLOUT_AUTH_TOKEN": TOKEN,
        "POLAR_ROLLOUT_STORE_URL": c.dsn,
        "POLAR_ROLLOUT_GATEWAY_ADDRESSES": json.dumps([f"{c.gateway_addr(i)}:{GRPC_PORT}" for i in (1, 2)]),
        "POLAR_ROLLOUT_HEARTBEAT_INTERVAL_S": "0.5",
        "POLAR_ROLLOUT_LEASE_TTL_S": "3",
        "POLAR_ROLLOUT_DISPATCH_INTERVAL_S": "0.1",
        "POLAR_ROLLOUT_WATCHDOG_INTERVAL_S": "0.2",
        "POLAR_ROLLOUT_RETRY_BACKOFF_S": "0.2",
        "POLAR_ROLLOUT_CALLBACK_BACKOFF_S": "0.1",
        "POLAR_ROLLOUT_CALLBACK_BACKOFF_MAX_S": "1",
        "POLAR_ROLLOUT_GATEWAY_RPC_TIMEOUT_S": "3",
        # A result whose report is lost after the restart (the gateway's channel may still be in its reconnect
        # backoff) is picked up by the watchdog at the session deadline: keep that deadline short.
        "POLAR_ROLLOUT_SESSION_GRACE_S": "5",
    }


def start_rollout(c: Cluster) -> None:
    c.serve("rollout", "ro", "rollout", c.addr(20), GRPC_PORT, rollout_env(c))


def start_gateway_host(c: Cluster, index: int) -> list[str]:
    """Start a gateway host: proxy (scripted backend, tiny model), reconstructor, evaluator and the gateway."""
    host, address = f"g{index}", c.gateway_addr(index)
    turns = [{"text": f"Answer number {i}."} for i in range(4)]
    proxy = {
        "POLAR_PROXY_AUTH_TOKEN": TOKEN,
        "POLAR_PROXY_BACKEND": "scripted",
        "POLAR_PROXY_BACKEND_OPTIONS": json.dumps({"turns": turns}),
        "POLAR_PROXY_MODEL": "tiny",
        "POLAR_PROXY_HTTP_HOST": address,
        "POLAR_PROXY_HTTP_PORT": str(PROXY_HTTP_PORT),
        "POLAR_PROXY_CONTEXT_LENGTH": "32768",
        "POLAR_PROXY_FSYNC": "false",
    }
    gateway = {
        "POLAR_GATEWAY_AUTH_TOKEN": TOKEN,
        "POLAR_GATEWAY_GATEWAY_ID": f"gw{index}",
        "POLAR_GATEWAY_PROXY_ADDRESS": f"{address}:{PROXY_PORT}",
        "POLAR_GATEWAY_RECONSTRUCTOR_ADDRESS": f"{address}:{RECONSTRUCTOR_PORT}",
        "POLAR_GATEWAY_EVALUATOR_ADDRESS": f"{address}:{EVALUATOR_PORT}",
        "POLAR_GATEWAY_ROLLOUT_ADDRESS": c.rollout_target,
        "POLAR_GATEWAY_MAX_SESSIONS": str(PER_GATEWAY),
        "POLAR_GATEWAY_INIT_WORKERS": str(PER_GATEWAY),
        "POLAR_GATEWAY_RUNNING_WORKERS": str(PER_GATEWAY),
        "POLAR_GATEWAY_RUNTIME_NETWORK": "host",
        "POLAR_GATEWAY_METRICS_PORT": "-1",
        "POLAR_GATEWAY_STEP_TIMEOUT_S": "10",
        "POLAR_GATEWAY_STEP_RETRIES": "1",
    }
    services = [
        ("proxy", PROXY_PORT, proxy),
        ("reconstructor", RECONSTRUCTOR_PORT, {"POLAR_RECONSTRUCTOR_AUTH_TOKEN": TOKEN}),
        ("evaluator", EVALUATOR_PORT, {"POLAR_EVALUATOR_AUTH_TOKEN": TOKEN}),
        ("gateway", GRPC_PORT, gateway),
    ]
    for service, port, env in services:
        c.serve(f"{service}{index}", host, service, address, port, env)
    return [f"{service}{index}" for service, _, _ in services]


class DedupTrainer(trainer_callback_service_pb2_grpc.TrainerCallbackServiceServicer):
    """A trainer that applies each result once: deliveries are deduplicated on their idempotency key."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[str, str]] = []
        self.applied: dict[str, session_pb2.SessionResult] = {}
        self.effects: dict[str, int] = {}

    async def DeliverSessionResult(self, request: Any, context: Any) -> Any:
        key, result = request.idempotency_key, request.session_result
        self.deliveries.append((key, result.session_id))
        duplicate = key in self.applied
        if not duplicate:
            self.applied[key] = result
            self.effects[result.session_id] = self.effects.get(result.session_id, 0) + 1
        return trainer_callback_service_pb2.DeliverSessionResultResponse(duplicate=duplicate)


@contextlib.asynccontextmanager
async def trainer_server(host: str) -> AsyncIterator[tuple[DedupTrainer, int]]:
    trainer = DedupTrainer()
    name = trainer_callback_service_pb2.DESCRIPTOR.services_by_name["TrainerCallbackService"].full_name
    reg = ServiceRegistration(
        name,
        lambda server: trainer_callback_service_pb2_grpc.add_TrainerCallbackServiceServicer_to_server(trainer, server),
    )
    server, port = await start_grpc_server([reg], host=host, port=0, auth_token=TOKEN)
    try:
        yield trainer, port
    finally:
        await server.stop(None)


def make_task(callback_target: str) -> task_pb2.Task:
    task = task_pb2.Task(
        task_id=TASK_ID,
        instruction="Answer.",
        num_samples=SAMPLES,
        timeout_seconds=20,
        harness=task_pb2.HarnessSpec(name="command"),
        runtime=task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_LOCAL),
        evaluator=task_pb2.EvaluatorSpec(strategy="session_completed"),
        callback=task_pb2.CallbackSpec(grpc_target=callback_target),
    )
    # Two chat calls, an answer file, then a pause growing with the sample index (sessions finish staggered).
    task.harness.options.update({"argv": ["python3", "-c", CHAT_AGENT, "2", str(AGENT_PAUSE_S), "1.5", "3"]})
    return task


SESSION_IDS = [f"{TASK_ID}-{i:04d}" for i in range(SAMPLES)]


async def gateway_sessions(stub: Any) -> dict[str, Any]:
    """The SessionState of every session of the task that the gateway knows, by session id."""
    found: dict[str, Any] = {}
    for session_id in SESSION_IDS:
        try:
            reply = await stub.GetSession(gateway_service_pb2.GetSessionRequest(session_id=session_id), timeout=3)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                continue
            raise
        found[session_id] = reply.state
    return found


async def until(c: Cluster, what: str, check: Any, limit_s: float = 60.0) -> Any:
    """Poll the async ``check`` until it returns something truthy; fail with the services' logs otherwise."""
    deadline = time.monotonic() + limit_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{c.logs()}")
        await asyncio.sleep(0.1)


async def test_gateway_and_rollout_crashes_lose_no_session(cluster: Cluster) -> None:
    c = cluster
    started = time.monotonic()
    start_rollout(c)
    keys = ["rollout", *start_gateway_host(c, 1), *start_gateway_host(c, 2)]
    await c.wait_healthy(keys)
    print(f"cluster healthy after {time.monotonic() - started:.1f}s")

    gw = {i: open_channel(f"{c.gateway_addr(i)}:{GRPC_PORT}", auth_token=TOKEN) for i in (1, 2)}
    gw1, gw2 = (gateway_service_pb2_grpc.GatewayServiceStub(gw[i]) for i in (1, 2))
    watched: list[session_pb2.SessionResult] = []
    watcher_task: asyncio.Task[None] | None = None
    try:
        async with (
            trainer_server(c.client_addr) as (trainer, trainer_port),
            RolloutClient(c.rollout_target, token=TOKEN, timeout_s=10) as client,
        ):
            await client.submit(make_task(f"{c.client_addr}:{trainer_port}"))

            async def watch() -> None:
                # One watcher across the rollout server's crash: it resumes from the next result index.
                async with RolloutClient(c.rollout_target, token=TOKEN) as watcher:
                    async for result in watcher.watch(TASK_ID):
                        watched.append(result)

            watcher_task = asyncio.create_task(watch())

            # 1. Gateway 1 dies (SIGKILL) while its sessions run.
            async def running_on_gw1() -> dict[str, Any]:
                states = await gateway_sessions(gw1)
                running = [s for s in states.values() if s.stage == status_pb2.SESSION_STAGE_RUNNING]
                return states if running else {}

            lost = set(await until(c, "a session running on gateway 1", running_on_gw1))
            c.kill("gateway1")
            print(f"killed gateway 1 at {time.monotonic() - started:.1f}s with sessions {sorted(lost)}")

            # 2. Its sessions are retried on gateway 2; the rollout server dies while a retried one runs there.
            async def retry_running_on_gw2() -> bool:
                states = await gateway_sessions(gw2)
                return any(
                    sid in lost and s.attempt >= 2 and s.stage == status_pb2.SESSION_STAGE_RUNNING
                    for sid, s in states.items()
                )

            await until(c, "a retried session running on gateway 2", retry_running_on_gw2)
            c.kill("rollout")
            at_kill = await gateway_sessions(gw2)
            print(f"killed the rollout server at {time.monotonic() - started:.1f}s")

            # While it is down, a session finishes on gateway 2: its report is lost, reconciliation must find it.
            async def finished_while_down() -> list[str]:
                states = await gateway_sessions(gw2)
                return [
                    sid
                    for sid, s in states.items()
                    if s.stage == status_pb2.SESSION_STAGE_DONE
                    and (sid not in at_kill or at_kill[sid].stage != status_pb2.SESSION_STAGE_DONE)
                ]

            await until(c, "a session finishing while the rollout server is down", finished_while_down)
            # Sessions still running now must be re-attached after the restart, not run again.
            still_running = {
                sid: s.attempt
                for sid, s in (await gateway_sessions(gw2)).items()
                if s.stage != status_pb2.SESSION_STAGE_DONE
            }
            start_rollout(c)
            await c.wait_healthy(["rollout"])
            print(f"restarted the rollout server at {time.monotonic() - started:.1f}s; running: {still_running}")

            # 3. The task completes and every result reaches the trainer.
            async def completed() -> Any:
                try:
                    info = (await client.get(TASK_ID, summary_only=True)).task
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:  # the channel may still be reconnecting
                        raise
                    return None
                done = info.status == status_pb2.TASK_STATUS_COMPLETED
                return info if done and info.statistics.deliveries_delivered == SAMPLES else None

            info = await until(c, "the task to complete and be delivered", completed, limit_s=120)
            print(f"task completed and delivered at {time.monotonic() - started:.1f}s")
            results = list((await client.get(TASK_ID)).session_results)
            await asyncio.wait_for(watcher_task, 30)
    finally:
        if watcher_task is not None and not watcher_task.done():
            watcher_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher_task
        for channel in gw.values():
            await channel.close(None)

    # Every session has exactly one final result, usable; those of gateway 1 ran again on gateway 2.
    assert sorted(r.session_id for r in results) == SESSION_IDS, c.logs()
    assert {r.status for r in results} == {"resolved"}, [(r.session_id, r.status, r.error_message) for r in results]
    by_id = {r.session_id: r for r in results}
    for session_id in lost:
        assert by_id[session_id].gateway_id == "gw2"
        assert by_id[session_id].attempt >= 2
    for session_id, attempt in still_running.items():
        assert (by_id[session_id].gateway_id, by_id[session_id].attempt) == ("gw2", attempt)
    assert info.sessions_done == info.sessions_usable == SAMPLES
    assert info.statistics.sessions_dropped == 0
    assert info.statistics.sessions_retried >= len(lost)
    assert info.statistics.deliveries_dead_lettered == 0

    # The watcher that spanned the crash saw every result exactly once.
    assert sorted(r.session_id for r in watched) == SESSION_IDS

    # The trainer saw every result's key (at least once) and applied exactly one effect per session.
    result_keys = {r.idempotency_key for r in results}
    assert {key for key, _ in trainer.deliveries} == result_keys
    assert set(trainer.applied) == result_keys
    assert trainer.effects == dict.fromkeys(SESSION_IDS, 1)

    # The durable record agrees: gateway 1's attempts ended infra_error, one result and delivery per session.
    conn = await asyncpg.connect(c.dsn)
    try:
        infra = await conn.fetch(
            "SELECT session_id FROM reports WHERE status = 'infra_error' AND gateway_id = 'gw1' AND final = 0"
        )
        assert {row["session_id"] for row in infra} >= lost
        sessions = await conn.fetch("SELECT session_id, state FROM sessions WHERE task_id = $1", TASK_ID)
        assert {row["state"] for row in sessions} == {"done"}
        assert await conn.fetchval("SELECT count(*) FROM results WHERE task_id = $1", TASK_ID) == SAMPLES
        deliveries = await conn.fetch("SELECT state FROM deliveries WHERE task_id = $1", TASK_ID)
        assert [row["state"] for row in deliveries] == ["delivered"] * SAMPLES
    finally:
        await conn.close()
