"""Agent failures told apart from the policy's, with real services in their own processes.

The model proxy runs alone (``polar serve proxy``, scripted backend) so that it can be killed; the rollout
server, gateway, reconstructor and evaluator run together in a second ``polar serve`` process. The agent is
the ``command`` harness: a Python script making chat calls through the proxy, retrying a call that cannot
connect (as real CLIs retry).

* The proxy is SIGKILLed mid-task and restarted on the same ports and state directory: every session still
  ends ``resolved``, exactly once, with every model call of its final attempt recorded; attempts lost to the
  outage do not use up the session's attempts.
* A harness that exits 3 with a message on stderr before its first model call ends ``infra_error`` with its
  exit code and the stderr in the error message, and is retried (all three attempts).
* A gateway that cannot find a task's harness CLI refuses it at StartSession with FAILED_PRECONDITION naming
  the CLI and the setup script.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
from polar.common.v1 import session_pb2, status_pb2, task_pb2
from polar.gateway.v1 import gateway_service_pb2, gateway_service_pb2_grpc

from integration_tests.support.ports import free_port
from integration_tests.support.services import wait_serving
from polar_client import RolloutClient
from polar_core.channels import open_channel

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for the workspace"),
    pytest.mark.skipif(shutil.which("python3") is None, reason="the agent script needs python3 on PATH"),
]

TOKEN = "agent-failures-token"
CALLS = 6

# Six chat calls a second apart; a call that cannot connect (the proxy is down) is retried every 0.3 s for a
# minute, the way real agent CLIs retry their HTTP calls.
AGENT = """
import json, os, sys, time, urllib.error, urllib.request
messages = []
for i in range(int(sys.argv[1])):
    messages.append({"role": "user", "content": f"step {i}"})
    body = json.dumps({"model": os.environ["POLAR_MODEL"], "messages": messages}).encode()
    for attempt in range(200):
        request = urllib.request.Request(
            os.environ["OPENAI_BASE_URL"] + "/chat/completions",
            data=body,
            headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
        )
        try:
            reply = json.loads(urllib.request.urlopen(request, timeout=30).read())
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            if isinstance(exc, urllib.error.HTTPError) and exc.code < 500:
                raise
            print(f"call {i} attempt {attempt}: {exc}", file=sys.stderr, flush=True)
            time.sleep(0.3)
    else:
        sys.exit("the model never answered")
    messages.append(reply["choices"][0]["message"])
    time.sleep(1.0)
open("answer.txt", "w").write("42\\n")
"""


@dataclasses.dataclass
class Stack:
    """The two ``polar serve`` processes and their addresses."""

    root: Path
    ports: dict[str, int]
    processes: dict[str, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def log(self, key: str) -> Path:
        return self.root / f"{key}.log"

    def start(self, key: str, services: list[str], env: Mapping[str, str]) -> None:
        state = self.root / key
        state.mkdir(parents=True, exist_ok=True)
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
        full_env.update(env)
        full_env["no_proxy"] = full_env["NO_PROXY"] = "*"
        argv = [sys.executable, "-m", "polar_run", "-v", "serve", *services, "--state-dir", str(state)]
        argv += ["--host", "127.0.0.1"]
        with self.log(key).open("ab") as out:
            self.processes[key] = subprocess.Popen(
                argv, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=state
            )

    def kill(self, key: str) -> None:
        process = self.processes[key]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def logs(self) -> str:
        parts = []
        for key, process in self.processes.items():
            text = self.log(key).read_text(errors="replace") if self.log(key).exists() else ""
            parts.append(f"===== {key} (exit {process.poll()}) =====\n{text[-4000:]}")
        return "\n".join(parts)

    async def wait_healthy(self, names: list[str], limit_s: float = 90.0) -> None:
        deadline = time.monotonic() + limit_s
        for name in names:
            await wait_serving(self.address(name), name, deadline, self.logs)

    def start_proxy(self) -> None:
        turns = [{"text": f"Answer number {i}."} for i in range(CALLS)]
        self.start(
            "proxy",
            ["proxy"],
            {
                "POLAR_PROXY_AUTH_TOKEN": TOKEN,
                "POLAR_PROXY_PORT": str(self.ports["proxy"]),
                "POLAR_PROXY_BACKEND": "scripted",
                "POLAR_PROXY_BACKEND_OPTIONS": json.dumps({"turns": turns}),
                "POLAR_PROXY_MODEL": "tiny",
                "POLAR_PROXY_HTTP_HOST": "127.0.0.1",
                "POLAR_PROXY_HTTP_PORT": str(self.ports["proxy_http"]),
                "POLAR_PROXY_CONTEXT_LENGTH": "32768",
            },
        )

    def start_services(self) -> None:
        env = {
            "POLAR_ROLLOUT_AUTH_TOKEN": TOKEN,
            "POLAR_ROLLOUT_PORT": str(self.ports["rollout"]),
            "POLAR_ROLLOUT_HEARTBEAT_INTERVAL_S": "0.3",
            "POLAR_ROLLOUT_DISPATCH_INTERVAL_S": "0.1",
            "POLAR_ROLLOUT_WATCHDOG_INTERVAL_S": "0.2",
            "POLAR_ROLLOUT_RETRY_BACKOFF_S": "0.2",
            "POLAR_RECONSTRUCTOR_AUTH_TOKEN": TOKEN,
            "POLAR_RECONSTRUCTOR_PORT": str(self.ports["reconstructor"]),
            "POLAR_EVALUATOR_AUTH_TOKEN": TOKEN,
            "POLAR_EVALUATOR_PORT": str(self.ports["evaluator"]),
            "POLAR_GATEWAY_AUTH_TOKEN": TOKEN,
            "POLAR_GATEWAY_PORT": str(self.ports["gateway"]),
            "POLAR_GATEWAY_GATEWAY_ID": "gw",
            "POLAR_GATEWAY_PROXY_ADDRESS": self.address("proxy"),
            "POLAR_GATEWAY_MAX_SESSIONS": "4",
            "POLAR_GATEWAY_INIT_WORKERS": "4",
            "POLAR_GATEWAY_RUNNING_WORKERS": "4",
            "POLAR_GATEWAY_RUNTIME_NETWORK": "host",
            "POLAR_GATEWAY_METRICS_PORT": "-1",
            "POLAR_GATEWAY_STEP_TIMEOUT_S": "10",
            "POLAR_GATEWAY_STEP_RETRIES": "1",
            # The missing-CLI test's gateway finds no harness CLIs here (an empty directory).
            "POLAR_GATEWAY_HARNESS_BIN_DIR": str(self.root / "no-clis"),
        }
        (self.root / "no-clis").mkdir(exist_ok=True)
        self.start("services", ["rollout", "reconstructor", "evaluator", "gateway"], env)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    names = ("proxy", "proxy_http", "rollout", "reconstructor", "evaluator", "gateway")
    s = Stack(tmp_path, {name: free_port() for name in names})
    s.start_proxy()
    s.start_services()
    try:
        await s.wait_healthy(["proxy", "rollout", "reconstructor", "evaluator", "gateway"])
        yield s
    finally:
        for key in list(s.processes):
            s.kill(key)


def make_task(task_id: str, argv: list[str], samples: int) -> task_pb2.Task:
    task = task_pb2.Task(
        task_id=task_id,
        instruction="Answer.",
        num_samples=samples,
        timeout_seconds=90,
        harness=task_pb2.HarnessSpec(name="command"),
        runtime=task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_LOCAL),
        evaluator=task_pb2.EvaluatorSpec(strategy="session_completed"),
    )
    task.harness.options.update({"argv": argv})
    return task


async def until(stack: Stack, what: str, check: Any, limit_s: float = 90.0) -> Any:
    deadline = time.monotonic() + limit_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{stack.logs()}")
        await asyncio.sleep(0.1)


async def finished(client: RolloutClient, task_id: str) -> list[session_pb2.SessionResult] | None:
    reply = await client.get(task_id)
    if reply.task.status != status_pb2.TASK_STATUS_COMPLETED:
        return None
    return list(reply.session_results)


async def test_proxy_killed_and_restarted_mid_task_loses_no_session(stack: Stack) -> None:
    samples = 4
    gw_channel = open_channel(stack.address("gateway"), auth_token=TOKEN)
    gateway = gateway_service_pb2_grpc.GatewayServiceStub(gw_channel)
    try:
        async with RolloutClient(stack.address("rollout"), token=TOKEN, timeout_s=10) as client:
            await client.submit(make_task("outage", ["python3", "-c", AGENT, str(CALLS)], samples))

            async def running() -> bool:
                reply = await gateway.GetCapacity(gateway_service_pb2.GetCapacityRequest(), timeout=3)
                return reply.active_sessions == samples

            await until(stack, "the sessions to run", running)
            await asyncio.sleep(2.5)  # a few calls made by every agent
            stack.kill("proxy")

            async def no_capacity() -> bool:
                reply = await gateway.GetCapacity(gateway_service_pb2.GetCapacityRequest(), timeout=3)
                return reply.available == 0

            # While the proxy is down the gateway advertises no capacity.
            await until(stack, "the gateway to advertise no capacity", no_capacity, limit_s=15)
            await asyncio.sleep(2.0)
            stack.start_proxy()  # same ports, same state directory
            await stack.wait_healthy(["proxy"])
            results = await until(stack, "the task to complete", lambda: finished(client, "outage"), limit_s=150)
            info = (await client.get("outage", summary_only=True)).task
    finally:
        await gw_channel.close(None)

    assert sorted(r.session_id for r in results) == [f"outage-{i:04d}" for i in range(samples)], stack.logs()
    assert [r.status for r in results] == ["resolved"] * samples, [(r.status, r.error_message) for r in results]
    for r in results:
        assert r.statistics.completions == CALLS, (r.session_id, r.attempt, r.statistics)
        assert r.HasField("harness_exit_code")
        assert r.harness_exit_code == 0
    # Attempts lost to the outage did not use up the sessions' attempts (max 3), however many there were.
    assert info.statistics.sessions_dropped == 0


async def test_harness_exiting_before_its_first_call_is_infra_error_and_retried(stack: Stack) -> None:
    argv = ["sh", "-c", "echo 'starting up' >&2; echo 'fatal: cannot read the agent config' >&2; exit 3"]
    async with RolloutClient(stack.address("rollout"), token=TOKEN, timeout_s=10) as client:
        await client.submit(make_task("crash", argv, 1))
        results = await until(stack, "the task to complete", lambda: finished(client, "crash"))
        info = (await client.get("crash", summary_only=True)).task
    (result,) = results
    assert result.status == "infra_error", result
    assert result.harness_exit_code == 3
    assert not result.dependency_unavailable
    assert "exited with code 3 before its first model call" in result.error_message
    assert "fatal: cannot read the agent config" in result.error_message
    assert result.attempt == 3  # retried per policy (max_attempts 3)
    assert info.statistics.attempts_total == 3


async def test_missing_harness_cli_is_refused_at_admission(stack: Stack) -> None:
    channel = open_channel(stack.address("gateway"), auth_token=TOKEN)
    try:
        stub = gateway_service_pb2_grpc.GatewayServiceStub(channel)
        task = make_task("nocli", [], 1)
        task.harness.CopyFrom(task_pb2.HarnessSpec(name="pi"))
        spec = session_pb2.SessionSpec(session_id="nocli-0000", task_id="nocli", task=task, attempt=1)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.StartSession(gateway_service_pb2.StartSessionRequest(spec=spec), timeout=10)
    finally:
        await channel.close(None)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    message = refused.value.details() or ""
    assert "'pi'" in message
    assert "bash scripts/setup_harnesses.sh" in message

    # Through the rollout server it is a placement failure: the session waits for a gateway that can run it,
    # using up no attempt and recording no result.
    async with RolloutClient(stack.address("rollout"), token=TOKEN, timeout_s=10) as client:
        task.task_id = "nocli-rollout"
        await client.submit(task)
        log = stack.log("services")
        await until(stack, "the refusal", lambda: _logged(log, "refused session nocli-rollout-0000"), limit_s=30)
        info = (await client.get("nocli-rollout", summary_only=True)).task
        assert info.sessions_done == 0
        assert info.statistics.attempts_total == 0
        await client.cancel("nocli-rollout")


async def _logged(log: Path, text: str) -> bool:
    content = await asyncio.to_thread(log.read_text, errors="replace")
    return text in content
