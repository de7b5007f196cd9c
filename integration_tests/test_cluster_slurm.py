"""``polar cluster`` on a real Slurm: up, a task, a gateway scancelled mid-session, scale, status, logs, down.

A private Slurm (munged, slurmctld and three slurmd node names on this host, ``integration_tests/support/slurm.py``)
runs the fleet of one topology file as Slurm jobs: the rollout server on a private PostgreSQL, a proxy (scripted
backend, tiny model), a reconstructor, an evaluator and three gateways. The ``polar cluster`` commands run as the
user runs them (subprocesses of the real CLI), and ``polar cluster supervise`` keeps the fleet at size.

A real task of 24 sessions runs (``examples/tasks/paginate``: a repository with an off-by-one bug, graded by the
``swe`` evaluator's tests in a clean runtime), its agent a ``command``-harness program that makes two model calls
through the proxy, applies the right fix in even-numbered sessions only, then pauses; one gateway's job is
``scancel``-ed while it holds sessions: it hands them back as an outage (no attempt used), the rollout server runs
them again elsewhere, and the supervisor queues a replacement job. ``scale gateway 4`` adds a fourth. Every session
ends exactly once (results, a watcher, the database), resolved exactly where the fix is right; no token appears in
a script or in Slurm's view of the jobs, and ``down`` leaves no job and no process of the fleet (services or
sandboxes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest
from polar.common.v1 import session_pb2, status_pb2, task_pb2
from polar.rollout.v1 import rollout_service_pb2, rollout_service_pb2_grpc

from integration_tests.support.postgres import postgres_available, private_postgres
from integration_tests.support.services import POLAR_ARGV, free_port
from integration_tests.support.slurm import PrivateSlurm, private_slurm, slurm_missing
from polar_client import RolloutClient, load_task
from polar_core.channels import open_channel
from polar_run.cluster.scripts import render_script
from polar_run.cluster.state import StateDir
from polar_run.cluster.topology import load_topology

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(480),
    pytest.mark.skipif(sys.platform != "linux", reason="Slurm runs on Linux"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="the gateways' sandboxes need bubblewrap"),
    pytest.mark.skipif(shutil.which("python3") is None, reason="the agent script needs python3 on PATH"),
    pytest.mark.skipif(not postgres_available(), reason="PostgreSQL 15 binaries are not installed"),
]

REPO = Path(__file__).resolve().parents[1]
TASK_ID = "slurm"
SAMPLES = 24
PER_GATEWAY = 3
AGENT_PAUSE_S = 4.0
SESSION_IDS = [f"{TASK_ID}-{i:04d}" for i in range(SAMPLES)]

# Two chat calls through the proxy, the fix in even-numbered sessions (the task's tests then pass), then a pause (so
# that a gateway can be cancelled mid-session).
AGENT = """
import json, os, sys, time, urllib.request
messages = []
for i in range(int(sys.argv[1])):
    messages.append({"role": "user", "content": f"step {i}"})
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": os.environ["POLAR_MODEL"], "messages": messages}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    reply = json.loads(urllib.request.urlopen(request, timeout=60).read())
    messages.append(reply["choices"][0]["message"])
if int(os.environ["POLAR_SAMPLE_INDEX"]) % 2 == 0:
    code = open("pagination.py").read()
    open("pagination.py", "w").write(code.replace("return total // per_page", "return -(-total // per_page)"))
time.sleep(float(sys.argv[2]))
"""


def topology_text(dsn: str) -> str:
    """The topology of the test (docs/deploy.md shows the same file): free ports, everything on loopback."""
    turns = ", ".join(f'{{ text = "Answer {i}." }}' for i in range(4))
    return f"""\
[cluster]
name = "e2e"
partition = "debug"
time_limit = "00:30:00"
state_dsn = "{dsn}"
bind_host = "127.0.0.1"
advertise_host = "127.0.0.1"
workdir = "{REPO}"
ready_timeout_s = 240

[tokens]
trainer = "trainer.token"

[roles.rollout]
port = {free_port()}
settings = {{ heartbeat_interval_s = 0.5, lease_ttl_s = 3, dispatch_interval_s = 0.1, watchdog_interval_s = 0.2, \
retry_backoff_s = 0.2, metrics_port = -1 }}

[roles.proxy]
port = {free_port()}
http_port = {free_port()}
settings = {{ backend = "scripted", model = "tiny", backend_options = {{ turns = [{turns}] }}, \
context_length = 32768, fsync = false, metrics_port = -1 }}

[roles.reconstructor]
port = {free_port()}
settings = {{ metrics_port = -1 }}

[roles.evaluator]
port = {free_port()}
settings = {{ metrics_port = -1 }}

[roles.gateway]
count = 3
drain_s = 20
settings = {{ max_sessions = {PER_GATEWAY}, init_workers = {PER_GATEWAY}, running_workers = {PER_GATEWAY}, \
metrics_port = -1, step_timeout_s = 10 }}
"""


@pytest.fixture
def slurm() -> Iterator[PrivateSlurm]:
    reason = slurm_missing()
    if reason is not None:
        pytest.skip(reason)
    with private_slurm(nodes=3, cpus=4, memory_mb=4000) as cluster:
        yield cluster


class Fleet:
    """The topology file, its state directory and the ``polar cluster`` command."""

    def __init__(self, root: Path, slurm: PrivateSlurm) -> None:
        self.topology = root / "e2e.toml"
        self.state = root / "e2e.cluster"
        self.slurm = slurm
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
        self.env.update(slurm.env)
        self.env["no_proxy"] = self.env["NO_PROXY"] = "*"

    def polar(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        argv = [*POLAR_ARGV, "cluster", "--topology", str(self.topology), *args]
        return subprocess.run(argv, env=self.env, cwd=REPO, capture_output=True, text=True, timeout=timeout)

    def check(self, *args: str) -> str:
        done = self.polar(*args)
        assert done.returncode == 0, f"polar cluster {' '.join(args)}: {done.stdout}\n{done.stderr}\n{self.logs()}"
        return done.stdout

    def slots(self) -> dict[str, dict[str, object]]:
        return dict(json.loads((self.state / "state.json").read_text())["slots"])

    def secret(self, name: str) -> str:
        return (self.state / "secrets" / name).read_text().strip()

    @property
    def rollout(self) -> str:
        return (self.state / "run" / "rollout-1.address").read_text().strip()

    def logs(self) -> str:
        parts = []
        for log in sorted((self.state / "logs").glob("*.log")) if self.state.exists() else []:
            parts.append(f"===== {log.name} =====\n{log.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts) + "\n" + self.slurm.logs()

    async def gateways(self) -> dict[str, rollout_service_pb2.GatewayInfo]:
        channel = open_channel(self.rollout, auth_token=self.secret("admin"))
        try:
            stub = rollout_service_pb2_grpc.RolloutServiceStub(channel)
            reply = await stub.ListGateways(rollout_service_pb2.ListGatewaysRequest(), timeout=5)
        finally:
            await channel.close(None)
        return {g.gateway_id: g for g in reply.gateways}

    def supervise(self) -> subprocess.Popen[str]:
        """Start ``polar cluster supervise`` (checking every second) in the background."""
        argv = [*POLAR_ARGV, "cluster", "--topology", str(self.topology), "supervise", "--interval", "1"]
        return subprocess.Popen(
            argv, env=self.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    @staticmethod
    def command_lines() -> str:
        """Every process's command line."""
        return subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True, check=True).stdout

    def processes(self) -> list[str]:
        """Processes of this fleet still alive (services, agents, sandboxes): their command lines name the state
        directory."""
        out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
        return [line for line in out.splitlines() if str(self.state) in line and "ps -eo" not in line]


async def until(fleet: Fleet, what: str, check: Callable[[], Awaitable[bool]], limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        value = await check()
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{fleet.logs()}")
        await asyncio.sleep(0.2)


def make_task() -> task_pb2.Task:
    """The example task (its repository, instruction and ``swe`` grading), run by the test's agent."""
    task = load_task(REPO / "examples" / "tasks" / "paginate" / "task.yaml")
    task.task_id = TASK_ID
    task.num_samples = SAMPLES
    task.timeout_seconds = 60
    task.harness.CopyFrom(task_pb2.HarnessSpec(name="command"))
    task.harness.options.update({"argv": ["python3", "-c", AGENT, "2", str(AGENT_PAUSE_S)]})
    return task


async def test_slurm_fleet_survives_scancel_and_scale(slurm: PrivateSlurm, tmp_path: Path) -> None:
    started = time.monotonic()
    with private_postgres() as dsn:
        fleet = Fleet(tmp_path, slurm)
        fleet.topology.write_text(topology_text(dsn))
        trainer_token = "trainer-" + os.urandom(12).hex()
        token_file = tmp_path / "trainer.token"
        token_file.write_text(trainer_token)
        token_file.chmod(0o600)

        print(fleet.check("up"))
        print(f"up after {time.monotonic() - started:.1f}s")
        supervisor = fleet.supervise()
        watched: list[session_pb2.SessionResult] = []
        try:
            async with RolloutClient(fleet.rollout, token=trainer_token, timeout_s=10) as client:
                await client.submit(make_task())

                async def watch() -> None:
                    async with RolloutClient(fleet.rollout, token=trainer_token) as watcher:
                        async for result in watcher.watch(TASK_ID):
                            watched.append(result)

                watcher = asyncio.create_task(watch())

                # 1. scancel gateway 2's job while it holds sessions.
                job = str(fleet.slots()["gateway-2"]["job_id"])
                victim = f"gateway-2-j{job}"

                async def busy() -> bool:
                    info = (await fleet.gateways()).get(victim)
                    return info is not None and info.active_sessions > 0

                await until(fleet, f"{victim} holding sessions", busy)
                slurm.run("scancel", job)
                print(f"scancelled {victim} at {time.monotonic() - started:.1f}s")

                # 2. The supervisor queues a replacement; then the fleet grows to four gateways.
                async def replaced() -> bool:
                    return str(fleet.slots()["gateway-2"]["job_id"]) != job

                await until(fleet, "a replacement of gateway 2", replaced)
                print(fleet.check("scale", "gateway", "4"))
                print(f"scaled to 4 at {time.monotonic() - started:.1f}s")

                # 3. The task completes.
                async def completed() -> bool:
                    info = (await client.get(TASK_ID, summary_only=True)).task
                    return bool(info.status == status_pb2.TASK_STATUS_COMPLETED)

                await until(fleet, "the task to complete", completed, limit_s=240)
                print(f"task completed at {time.monotonic() - started:.1f}s")
                results = list((await client.get(TASK_ID)).session_results)
                await asyncio.wait_for(watcher, 30)
                pool = await fleet.gateways()

            status = fleet.polar("status")
            logs = fleet.check("logs", "gateway", "--index", "1")
            fleet_slots = list(fleet.slots())
            scripts = {p.name: p.read_text() for p in (fleet.state / "scripts").glob("*.sbatch")}
            jobs_view = slurm.run("scontrol", "show", "job", "-d").stdout + slurm.run("squeue", "-o", "%all").stdout
            tokens = [trainer_token, *(fleet.secret(n) for n in ("gateway", "internal", "admin"))]
            command_lines = fleet.command_lines()

            # 4. Scaling down retires gateway 4 with SIGUSR1 (as Slurm's --signal=B:USR1 would): it drains and
            # its job ends on its own.
            retired = str(fleet.slots()["gateway-4"]["job_id"])
            fleet.check("scale", "gateway", "3")

            async def retired_gone() -> bool:
                return retired not in slurm.job_ids()

            await until(fleet, "the retired gateway's job to end", retired_gone)
            assert "gateway-4" not in fleet.slots()

            async def three_serving() -> bool:
                serving = await fleet.gateways()
                return sum(1 for g in serving.values() if g.live and not g.draining) == 3

            await until(fleet, "three gateways taking sessions", three_serving)

            # 5. Down: no job, no process, no sandbox is left.
            print(fleet.check("down"))
            supervisor.wait(timeout=60)
        finally:
            if supervisor.poll() is None:
                supervisor.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    supervisor.wait(timeout=30)
            if fleet.polar("status").stdout.count("RUNNING"):
                fleet.polar("down")
        supervisor_out = ""
        if supervisor.stdout is not None:
            supervisor_out = supervisor.stdout.read()
            supervisor.stdout.close()
        print(supervisor_out)

        # Every session ended exactly once, resolved where the agent applied the right fix and only there; those
        # of the cancelled gateway ran again elsewhere.
        assert sorted(r.session_id for r in results) == SESSION_IDS, fleet.logs()
        statuses = {r.session_id: (r.status, r.reward) for r in results}
        expected = {sid: ("resolved", 1.0) if i % 2 == 0 else ("unresolved", 0.0) for i, sid in enumerate(SESSION_IDS)}
        assert statuses == expected, [(r.session_id, r.status, r.error_message) for r in results]
        assert sorted(r.session_id for r in watched) == SESSION_IDS
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval("SELECT count(*) FROM results WHERE task_id = $1", TASK_ID) == SAMPLES
            handed = await conn.fetch(
                "SELECT session_id, status, error_message FROM reports WHERE gateway_id = $1 AND final = 0", victim
            )
            reports = await conn.fetch("SELECT session_id, status, gateway_id, error_message FROM reports")
            sessions = {
                row["session_id"]: row for row in await conn.fetch("SELECT * FROM sessions WHERE task_id = $1", TASK_ID)
            }
        finally:
            await conn.close()
        assert handed, f"{victim} held no session when it was cancelled"
        by_id = {r.session_id: r for r in results}
        for row in handed:
            assert row["status"] == "infra_error"
            assert "handed back" in row["error_message"], row["error_message"]
            assert by_id[row["session_id"]].gateway_id != victim
            # An outage, not a failure: it used up no attempt. (Its run elsewhere may fail on its own under load;
            # only such other infra errors may count.)
            others = [
                dict(r)
                for r in reports
                if r["session_id"] == row["session_id"]
                and r["status"] == "infra_error"
                and "handed back" not in r["error_message"]
            ]
            assert sessions[row["session_id"]]["infra_failures"] <= len(others), (dict(row), others)
            assert sessions[row["session_id"]]["outages"] >= 1
        assert {s["state"] for s in sessions.values()} == {"done"}

        # status showed four gateways registered and live, logs the gateway's output; the replacement is in the pool.
        assert status.returncode == 0, status.stdout + status.stderr
        gateway_rows = [line for line in status.stdout.splitlines() if line.startswith("gateway-")]
        assert len(gateway_rows) == 4, status.stdout
        assert all(" yes " in line and " live " in line for line in gateway_rows), status.stdout
        assert "GatewayService" in logs
        assert "replaced gateway-2" in supervisor_out
        assert sum(1 for g in pool.values() if g.live and not g.draining) == 4, pool

        # No credential in a script, in Slurm's view of the jobs, or on a command line.
        assert sorted(scripts) == [f"{slot}.sbatch" for slot in sorted(fleet_slots)]
        assert all("--signal=B:USR1@50" in text for name, text in scripts.items() if "gateway" in name)
        for token in tokens:
            assert all(token not in text for text in scripts.values())
            assert token not in jobs_view
            assert token not in command_lines

        # Nothing is left: no job, no process of the fleet, no sandbox directory.
        assert slurm.job_ids() == [], slurm.run("squeue").stdout
        assert fleet.processes() == []
        leftovers = [p for p in (fleet.state / "data").glob("gateway-*/runtimes/*") if p.exists()]
        assert leftovers == []
    print(f"test done at {time.monotonic() - started:.1f}s")


def test_a_gateway_job_that_cannot_reach_the_rollout_server_fails_fast(tmp_path: Path) -> None:
    """The generated gateway script, run as Slurm would run it, ends at once when the rollout server does not
    answer, and leaves the reason where ``polar cluster status`` reads it."""
    topology_file = tmp_path / "e2e.toml"
    topology_file.write_text(topology_text("sqlite:////nonexistent/never-opened.sqlite3"))
    token = tmp_path / "trainer.token"
    token.write_text("t")
    token.chmod(0o600)
    topology = load_topology(topology_file)
    state = StateDir(topology_file)
    state.write_secrets(topology)
    (state.run / "rollout-1.address").write_text(f"127.0.0.1:{free_port()}\n")  # nothing listens there
    script = state.scripts / "gateway-1.sbatch"
    script.write_text(render_script(topology, state, "gateway", 1))
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")} | {"SLURM_JOB_ID": "7"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 3, done.stdout + done.stderr
    reason = state.reported(state.failed_file("gateway-1", "7"))
    assert reason.startswith("polar cluster: gateway-1: cannot reach the rollout server at 127.0.0.1:"), reason
