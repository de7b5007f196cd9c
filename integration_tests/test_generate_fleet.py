"""``polar generate --server`` on a fleet of separate processes, across a rollout-server crash.

The rollout server (SQLite on disk), a model proxy (scripted backend, registered with the rollout server), a
reconstructor, an evaluator and a gateway each run as a ``polar serve`` process on 127.0.0.1. The agent is the
``command`` harness: a Python script making N chat calls through the proxy, then pausing. The dataset has two
tasks whose agents call the model, and one (``quiet``) whose agent makes no call: an empty generation, re-run
once as ``<task>.retry1``.

While ``polar generate --server`` runs, the rollout server is killed (SIGKILL) with sessions in flight and
restarted on the same port and store. The command must complete on its own (it reconnects and resumes its
watches), with every attempt in the ledger exactly once (the ledger's attempts equal the server's count), every
session in the output once, and every accepted session exported. Rerunning the same command resumes the run:
nothing is submitted or run again and the outputs are the same. A bad token and an unreachable server end the
command with exit status 2 and one line.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from polar.common.v1 import status_pb2

from integration_tests.support.services import CHAT_AGENT, POLAR_ARGV, ServiceProcesses, free_port
from polar_client import RolloutClient

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the local runtime is Linux-only"),
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for the workspace"),
    pytest.mark.skipif(shutil.which("python3") is None, reason="the agent script needs python3 on PATH"),
]

TOKEN = "generate-fleet-token"
HOST = "127.0.0.1"
# The agent pauses 2 s plus 1 s per sample index.
PAUSE = ("2", "1", "100")

# task id -> (samples, model calls, repository)
DATASET = {"alpha": (3, 2, "repo-a"), "beta": (2, 2, "repo-b"), "quiet": (1, 0, "repo-c")}


def write_dataset(path: Path) -> Path:
    lines = []
    for task_id, (samples, calls, repository) in DATASET.items():
        task = {
            "task_id": task_id,
            "instruction": "Answer.",
            "num_samples": samples,
            "timeout_seconds": 30,
            "harness": {"name": "command", "argv": ["python3", "-c", CHAT_AGENT, str(calls), *PAUSE]},
            "runtime": {"kind": "local"},
            "evaluator": {"strategy": "session_completed"},
            "metadata": {"repository": repository},
        }
        lines.append(json.dumps(task))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class Fleet:
    """The fleet's processes and ports."""

    def __init__(self, root: Path) -> None:
        self.procs = ServiceProcesses(root)
        self.ports = {name: free_port() for name in ("rollout", "gateway", "proxy", "proxy_http", "recon", "eval")}

    def address(self, name: str) -> str:
        return f"{HOST}:{self.ports[name]}"

    def start_rollout(self) -> None:
        env = {
            "POLAR_ROLLOUT_AUTH_TOKEN": TOKEN,
            "POLAR_ROLLOUT_GATEWAY_ADDRESSES": json.dumps([self.address("gateway")]),
            "POLAR_ROLLOUT_HEARTBEAT_INTERVAL_S": "0.5",
            "POLAR_ROLLOUT_LEASE_TTL_S": "3",
            "POLAR_ROLLOUT_DISPATCH_INTERVAL_S": "0.1",
            "POLAR_ROLLOUT_WATCHDOG_INTERVAL_S": "0.2",
            "POLAR_ROLLOUT_RETRY_BACKOFF_S": "0.2",
            "POLAR_ROLLOUT_GATEWAY_RPC_TIMEOUT_S": "3",
            "POLAR_ROLLOUT_SESSION_GRACE_S": "5",
        }
        self.procs.serve("rollout", "rollout", HOST, self.ports["rollout"], env)

    def start_gateway_host(self) -> list[str]:
        turns = [{"text": f"Answer number {i}."} for i in range(4)]
        proxy = {
            "POLAR_PROXY_AUTH_TOKEN": TOKEN,
            "POLAR_PROXY_BACKEND": "scripted",
            "POLAR_PROXY_BACKEND_OPTIONS": json.dumps({"turns": turns}),
            "POLAR_PROXY_MODEL": "tiny",
            "POLAR_PROXY_HTTP_HOST": HOST,
            "POLAR_PROXY_HTTP_PORT": str(self.ports["proxy_http"]),
            "POLAR_PROXY_FSYNC": "false",
            "POLAR_PROXY_ROLLOUT_ADDRESS": self.address("rollout"),
            "POLAR_PROXY_PROXY_ID": "proxy1",
        }
        gateway = {
            "POLAR_GATEWAY_AUTH_TOKEN": TOKEN,
            "POLAR_GATEWAY_GATEWAY_ID": "gw1",
            "POLAR_GATEWAY_PROXY_ADDRESS": self.address("proxy"),
            "POLAR_GATEWAY_RECONSTRUCTOR_ADDRESS": self.address("recon"),
            "POLAR_GATEWAY_EVALUATOR_ADDRESS": self.address("eval"),
            "POLAR_GATEWAY_ROLLOUT_ADDRESS": self.address("rollout"),
            "POLAR_GATEWAY_MAX_SESSIONS": "4",
            "POLAR_GATEWAY_INIT_WORKERS": "4",
            "POLAR_GATEWAY_RUNNING_WORKERS": "4",
            "POLAR_GATEWAY_RUNTIME_NETWORK": "host",
            "POLAR_GATEWAY_METRICS_PORT": "-1",
            "POLAR_GATEWAY_STEP_TIMEOUT_S": "10",
            "POLAR_GATEWAY_STEP_RETRIES": "1",
        }
        services = [
            ("proxy", "proxy", proxy),
            ("reconstructor", "recon", {"POLAR_RECONSTRUCTOR_AUTH_TOKEN": TOKEN}),
            ("evaluator", "eval", {"POLAR_EVALUATOR_AUTH_TOKEN": TOKEN}),
            ("gateway", "gateway", gateway),
        ]
        for service, port, env in services:
            self.procs.serve(service, service, HOST, self.ports[port], env)
        return [service for service, _, _ in services]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path / "fleet")
    try:
        yield f
    finally:
        f.procs.kill_all()


def generate_argv(dataset: Path, out: Path, server: str, token: str = TOKEN) -> list[str]:
    return [*POLAR_ARGV, "generate", str(dataset), "--out", str(out), "--server", server, "--token", token, "--plain"]


def run_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    env["no_proxy"] = env["NO_PROXY"] = "*"
    return env


def start_polar(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=run_env())


def run_polar(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=run_env(), timeout=60, check=False)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def sessions_done(client: RolloutClient, run_id: str) -> tuple[int, int]:
    """Finished sessions of the run's first-round tasks, and their total (0, 0 while the server is away)."""
    done = total = 0
    for task_id in DATASET:
        try:
            info = (await client.get(f"{run_id}.{task_id}", summary_only=True)).task
        except grpc.aio.AioRpcError:
            return 0, 0
        done, total = done + info.sessions_done, total + info.sessions_total
    return done, total


async def wait_for(what: str, check: Any, fleet: Fleet, limit_s: float = 60.0) -> Any:
    deadline = time.monotonic() + limit_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{fleet.procs.logs()}")
        await asyncio.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_generate_on_a_fleet_survives_a_rollout_server_crash(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_rollout()
    await fleet.procs.wait_healthy(["rollout"])
    await fleet.procs.wait_healthy(fleet.start_gateway_host())
    dataset = write_dataset(tmp_path / "tasks.jsonl")
    out = tmp_path / "gen"
    proc = start_polar(generate_argv(dataset, out, fleet.address("rollout")), tmp_path / "generate.log")

    def output() -> str:
        return (tmp_path / "generate.log").read_text(errors="replace")

    try:
        manifest = await wait_for("fleet.json", lambda: _read_manifest(out), fleet)
        run_id = manifest["run_id"]
        async with RolloutClient(fleet.address("rollout"), token=TOKEN, timeout_s=5) as client:

            async def some_done() -> bool:
                done, total = await sessions_done(client, run_id)
                return 0 < done < total

            await wait_for("some sessions done, others in flight", some_done, fleet, limit_s=90)
        fleet.procs.kill("rollout")
        await asyncio.sleep(2.0)
        fleet.start_rollout()
        await fleet.procs.wait_healthy(["rollout"])
        code = await asyncio.to_thread(proc.wait, 150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, output() + fleet.procs.logs()

    ledger = json.loads((out / "ledger.json").read_text())
    totals = ledger["totals"]
    samples = sum(s for s, _, _ in DATASET.values())
    assert (totals["tasks"], totals["samples"], totals["sessions"]) == (3, samples, samples + 1), ledger
    assert (totals["empty_retries"], totals["accepted"], totals["rejected"]) == (1, samples - 1, {"empty": 1})
    summary = json.loads((out / "summary.json").read_text())
    # Every attempt the rollout server made is in the ledger exactly once.
    assert totals["attempts"] == summary["server_attempts"] == totals["sessions"] + totals["retries"]
    assert summary["run_id"] == run_id

    rows = read_jsonl(out / "sessions.jsonl")
    expected = {f"{run_id}.{t}-{i:04d}" for t, (n, _, _) in DATASET.items() for i in range(n)}
    expected.add(f"{run_id}.quiet.retry1-0000")
    assert sorted(r["session_id"] for r in rows) == sorted(expected)
    assert {r["outcome"] for r in rows if r["dataset_task_id"] != "quiet"} == {"accepted"}
    completions = read_jsonl(out / "completions.jsonl")
    assert len(completions) == len({c["call_id"] for c in completions}) == 2 * (samples - 1)
    records = [r for split in ("train", "validation") for r in read_jsonl(out / "sft" / f"{split}.jsonl")]
    assert sorted(r["session_id"] for r in records) == sorted(s for s in expected if ".quiet" not in s)
    assert all(r["messages"][-1]["role"] == "assistant" for r in records)

    # The same command again resumes the run: nothing new runs, the outputs are the same.
    again = await asyncio.to_thread(run_polar, generate_argv(dataset, out, fleet.address("rollout")))
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"resuming run {run_id}" in again.stdout
    assert json.loads((out / "ledger.json").read_text()) == ledger
    assert json.loads((out / "summary.json").read_text())["server_attempts"] == summary["server_attempts"]
    assert sorted(r["session_id"] for r in read_jsonl(out / "sessions.jsonl")) == sorted(expected)
    async with RolloutClient(fleet.address("rollout"), token=TOKEN) as client:
        tasks = (await client.list(page_size=50)).tasks
    submitted = [*(f"{run_id}.{t}" for t in DATASET), f"{run_id}.quiet.retry1"]
    assert sorted(t.task.task_id for t in tasks) == sorted(submitted)
    assert {t.status for t in tasks} == {status_pb2.TASK_STATUS_COMPLETED}

    # A bad token: exit 2, one line.
    bad = await asyncio.to_thread(
        run_polar, generate_argv(dataset, tmp_path / "bad", fleet.address("rollout"), token="wrong")
    )
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()]
    assert "refused the token" in bad.stderr


async def _read_manifest(out: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((out / "fleet.json").read_text()))
    except (OSError, ValueError):
        return None


@pytest.mark.timeout(60)
def test_generate_against_an_unreachable_server_is_a_usage_error(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "tasks.jsonl")
    server = f"{HOST}:{free_port()}"
    proc = run_polar(generate_argv(dataset, tmp_path / "out", server))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == f"polar: error: cannot reach the rollout server at {server} (is it running?)"
