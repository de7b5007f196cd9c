"""Gateways on a running Ray cluster: placed one per node, a node removed mid-task, nothing lost.

A real Ray cluster of three nodes on this machine (``ray.cluster_utils.Cluster``: a head and two workers, each
its own raylet), the real rollout server (SQLite), model proxy (scripted backend), reconstructor and evaluator
on loopback, all with a control-plane token (the gateways listen on the node address Ray picked, this machine's
own interface). :func:`polar_run.ray_fleet.start_fleet` places one real gateway
actor per node; each registers with the rollout server by itself. A task of six ``command``-harness sessions
runs; the worker node holding a running session is removed without grace (its raylet and the gateway's worker
process are killed). Then:

* every session ends exactly once, resolved; those the lost gateway held ran again elsewhere as an outage
  (``infra_failures`` 0: no attempt used up);
* the supervisor replaced the lost gateway on a surviving node under a new id, and the replacement registered;
* the token never appeared on a command line; a fleet pointed at a rollout address nobody serves is refused;
* ``RayFleet.stop`` while a second task runs hands its sessions back (pending again, no attempt used up, no
  result) and leaves no gateway serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import shutil
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from polar.common.v1 import status_pb2, task_pb2

from integration_tests.support.services import CHAT_AGENT, free_port
from polar_client import RolloutClient
from polar_core.errors import Unavailable
from polar_core.server import RunningService

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(420),
    pytest.mark.skipif(
        importlib.util.find_spec("ray") is None,
        reason="ray is not installed: .venv/bin/uv pip install --python .venv/bin/python -r requirements-ray.lock "
        "(scripts/setup.sh --all does it)",
    ),
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for the workspace"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(shutil.which("python3") is None, reason="the agent script needs python3 on PATH"),
]

TOKEN = "ray-fleet-control-plane-token"
TASK_ID = "rayfleet"
SAMPLES = 6
SESSION_IDS = [f"{TASK_ID}-{i:04d}" for i in range(SAMPLES)]
STOP_TASK_ID = "rayfleet-stop"
LOOPBACK = "127.0.0.1"
# Node death: the GCS declares a node dead after this many missed health checks of this period.
RAY_SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}


class Services:
    """The real services the gateways use, in this process on loopback."""

    rollout: RunningService[Any]
    rollout_address: str
    rollout_db: Path
    gateway_settings: dict[str, Any]


@pytest.fixture
async def services(tmp_path: Path) -> AsyncIterator[Services]:
    from evaluator.server import start_server as start_evaluator
    from evaluator.settings import EvaluatorSettings
    from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
    from model_proxy.server import start_server as start_proxy
    from model_proxy.settings import ProxySettings
    from polar_core.model_fixtures import build_tiny_tokenizer
    from reconstructor.server import start_server as start_reconstructor
    from reconstructor.settings import ReconstructorSettings
    from rollout_server.server import start_server as start_rollout
    from rollout_server.settings import RolloutSettings

    tokenizer = build_tiny_tokenizer()
    eot: Any = tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = ScriptedBackend(
        [ScriptTurn.from_dict({"text": f"Answer number {i}."}) for i in range(4)], tokenizer, end_of_turn_id=eot
    )
    proxy = await start_proxy(
        ProxySettings(state_dir=tmp_path / "proxy", fsync=False, context_length=32768, auth_token=TOKEN),
        backend=backend,
        tokenizer=tokenizer,
    )
    recon = await start_reconstructor(ReconstructorSettings(state_dir=tmp_path / "recon", auth_token=TOKEN))
    evaluator = await start_evaluator(EvaluatorSettings(state_dir=tmp_path / "evaluator", auth_token=TOKEN))
    rollout = await start_rollout(
        RolloutSettings(
            state_dir=tmp_path / "rollout",
            auth_token=TOKEN,
            heartbeat_interval_s=0.5,
            lease_ttl_s=4.0,
            dispatch_interval_s=0.1,
            watchdog_interval_s=0.2,
            retry_backoff_s=0.2,
            gateway_rpc_timeout_s=5.0,
        )
    )
    s = Services()
    s.rollout, s.rollout_address = rollout, f"{LOOPBACK}:{rollout.port}"
    s.rollout_db = tmp_path / "rollout" / "rollout.sqlite3"
    s.gateway_settings = {
        "auth_token": TOKEN,
        "state_dir": str(tmp_path / "gateways"),
        "proxy_address": f"{LOOPBACK}:{proxy.port}",
        "reconstructor_address": f"{LOOPBACK}:{recon.port}",
        "evaluator_address": f"{LOOPBACK}:{evaluator.port}",
        "max_sessions": 2,
        "init_workers": 2,
        "running_workers": 2,
        "metrics_port": -1,
        "step_timeout_s": 10.0,
        "step_retries": 1,
    }
    try:
        yield s
    finally:
        for service in (rollout, evaluator, recon, proxy):
            await service.stop(None)


def start_ray_cluster() -> Any:
    """A head and two worker nodes, one CPU each; on failure the nodes started so far are removed."""
    from ray.cluster_utils import Cluster

    cluster = Cluster()
    try:
        # Ray picks this machine's own interface address for its nodes (binding them to 127.0.0.1 leaves the
        # cluster's address pointing elsewhere); the gateways bind and advertise it, so they need the token.
        cluster.add_node(num_cpus=1, include_dashboard=False, _system_config=RAY_SYSTEM_CONFIG)
        for _ in range(2):
            cluster.add_node(num_cpus=1)
    except BaseException:
        cluster.shutdown()  # type: ignore[no-untyped-call]
        raise
    return cluster


@pytest.fixture
def ray_cluster() -> Iterator[Any]:
    import psutil  # type: ignore[import-untyped]
    import ray

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    try:
        cluster = start_ray_cluster()
    except Exception as exc:
        # Ray waits a fixed 30 s for a new raylet to register; on a loaded two-core machine it can take longer.
        # The failed node's processes are not tracked by the cluster: end them (our children, by pid), try again.
        if "timed out during startup" not in str(exc):
            raise
        for process in me.children(recursive=True):
            if process.pid not in before:
                with contextlib.suppress(psutil.Error):
                    process.kill()
        cluster = start_ray_cluster()
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def make_task(task_id: str = TASK_ID, samples: int = SAMPLES, pause_s: float = 5.0) -> task_pb2.Task:
    task = task_pb2.Task(
        task_id=task_id,
        instruction="Answer.",
        num_samples=samples,
        timeout_seconds=90,
        harness=task_pb2.HarnessSpec(name="command"),
        runtime=task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_LOCAL),
        evaluator=task_pb2.EvaluatorSpec(strategy="session_completed"),
    )
    # The shared fleet agent: two chat calls, an answer file, then PAUSE seconds (no per-sample stagger).
    task.harness.options.update({"argv": ["python3", "-c", CHAT_AGENT, "2", str(pause_s), "0", "1"]})
    return task


async def until(what: str, check: Any, limit_s: float = 120.0) -> Any:
    """Poll the async ``check`` until it returns something truthy."""
    deadline = time.monotonic() + limit_s
    while not (value := await check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)
    return value


def rollout_reports(db: Path) -> list[tuple[str, str, str]]:
    """``(session id, status, gateway id)`` of every attempt the rollout server recorded, from its SQLite file."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT session_id, status, gateway_id FROM reports ORDER BY session_id, attempt")
        return [(str(a), str(b), str(c)) for a, b, c in rows]


def token_on_a_command_line() -> list[str]:
    """Command lines of this machine's processes that contain the token."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes()
        except OSError:
            continue
        if TOKEN.encode() in text:
            found.append(text.replace(b"\0", b" ").decode(errors="replace"))
    return found


def serving(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


async def test_a_node_removed_mid_task_loses_no_session(services: Services, ray_cluster: Any) -> None:
    import ray
    from ray.exceptions import RayActorError

    from polar_run.ray_fleet import start_fleet

    store = services.rollout.app.core.store
    head_id = ray_cluster.head_node.node_id
    # A rollout address nobody serves: start_fleet fails within its timeout, naming the gateway and the address.
    nobody = f"{LOOPBACK}:{free_port()}"
    with pytest.raises(Unavailable, match=f"bad-0 on .* did not register with the rollout server at {nobody}"):
        await asyncio.to_thread(
            start_fleet,
            nobody,
            settings=services.gateway_settings,
            count=1,
            name="bad",
            start_timeout_s=120.0,
            register_timeout_s=5.0,
        )
    fleet = await asyncio.to_thread(
        start_fleet,
        services.rollout_address,
        settings=services.gateway_settings,
        per_node=1,
        name="rg",
        check_interval_s=0.5,
        start_timeout_s=120.0,
    )
    try:
        members = fleet.members()
        assert fleet.target == 3
        assert len({m.node_id for m in members}) == 3, members  # one per node
        registered = {g.gateway_id: g for g in await store.list_gateways()}
        assert set(registered) == {"rg-0", "rg-1", "rg-2"}
        assert {registered[m.gateway_id].address for m in members} == {m.address for m in members}

        async with RolloutClient(services.rollout_address, token=TOKEN, timeout_s=10) as client:
            await client.submit(make_task())

            # A worker node whose gateway holds a running session goes away without grace.
            on_worker = {m.gateway_id: m for m in members if m.node_id != head_id}

            async def running_on_a_worker() -> list[Any]:
                sessions = await store.task_sessions(TASK_ID)
                return [s for s in sessions if s.state.value == "running" and s.gateway_id in on_worker]

            victim = on_worker[(await until("a session running on a worker node", running_on_a_worker))[0].gateway_id]
            held = [s.session_id for s in await running_on_a_worker() if s.gateway_id == victim.gateway_id]
            (node,) = [n for n in ray_cluster.worker_nodes if n.node_id == victim.node_id]
            await asyncio.to_thread(ray_cluster.remove_node, node, False)

            async def completed() -> Any:
                reply = await client.get(TASK_ID)
                return reply if reply.task.status == status_pb2.TASK_STATUS_COMPLETED else None

            reply = await until("the task to complete", completed, limit_s=180.0)

            # The supervisor replaced the lost gateway on a surviving node; the replacement registered.
            def replaced() -> list[Any]:
                now = fleet.members()
                return now if len(now) == 3 and victim.gateway_id not in {m.gateway_id for m in now} else []

            async def replacement_ready() -> list[Any]:
                return await asyncio.to_thread(replaced)

            now = await until("the replacement gateway", replacement_ready)
            (new,) = [m for m in now if m.gateway_id not in {"rg-0", "rg-1", "rg-2"}]
            assert new.node_id != victim.node_id
            assert fleet.replaced == 1
            gateways = {g.gateway_id: g for g in await store.list_gateways()}
            assert gateways[new.gateway_id].address == new.address
            assert gateways[new.gateway_id].lease_expires_at > time.time()

        # Every session ended exactly once, resolved; the lost ones ran again elsewhere, as an outage.
        results = list(reply.session_results)
        assert sorted(r.session_id for r in results) == SESSION_IDS
        assert {r.status for r in results} == {"resolved"}, [(r.session_id, r.status, r.error_message) for r in results]
        by_id = {r.session_id: r for r in results}
        for session_id in held:
            assert by_id[session_id].gateway_id != victim.gateway_id
            assert by_id[session_id].attempt >= 2
        sessions = {s.session_id: s for s in await store.task_sessions(TASK_ID)}
        # The attempts lost with the node count as outages, never as failures: a held session's infra_failures
        # are only the ordinary infra_error reports of other gateways (under load a retried attempt may fail).
        reports = rollout_reports(services.rollout_db)
        for sid in held:
            lost = [r for r in reports if r[0] == sid and r[2] == victim.gateway_id]
            others = [r for r in reports if r[0] == sid and r[2] != victim.gateway_id and r[1] == "infra_error"]
            assert [r[1] for r in lost] == ["infra_error"], reports
            assert (sessions[sid].outages, sessions[sid].infra_failures) == (len(lost), len(others)), reports
        assert reply.task.sessions_done == SAMPLES
        assert reply.task.statistics.sessions_dropped == 0

        assert token_on_a_command_line() == []

        # Stopping the fleet mid-session hands the held sessions back: none ends, none uses up an attempt.
        async with RolloutClient(services.rollout_address, token=TOKEN, timeout_s=10) as client:
            await client.submit(make_task(STOP_TASK_ID, 2, pause_s=60.0))

            async def running() -> list[Any]:
                return [s for s in await store.task_sessions(STOP_TASK_ID) if s.state.value == "running"]

            stopped = {s.session_id for s in await until("the second task running", running)}
            members = fleet.members()
            await asyncio.to_thread(fleet.stop, 3.0)

            async def handed_back() -> list[Any]:
                sessions = await store.task_sessions(STOP_TASK_ID)
                back = all(s.state.value == "pending" for s in sessions)
                return sessions if back and all(s.outages for s in sessions if s.session_id in stopped) else []

            sessions = await until("the held sessions handed back", handed_back, limit_s=60.0)
            assert all(s.infra_failures == 0 for s in sessions), sessions
            assert list((await client.get(STOP_TASK_ID)).session_results) == []
    finally:
        await asyncio.to_thread(fleet.stop, 3.0)
    assert fleet.members() == []
    for member in members:
        with pytest.raises(RayActorError):
            await asyncio.to_thread(ray.get, member.handle.ping.remote(), timeout=30)
        assert not serving(member.address)
