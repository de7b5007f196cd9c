"""Per-role credentials: what each token may call, a service that will not listen unprotected, and a sandbox
that finds no credential of the control plane.

* A rollout server with trainer, gateway and internal tokens: a missing or unknown token is UNAUTHENTICATED,
  a known token of the wrong role PERMISSION_DENIED with a message naming the method and both roles.
* ``polar serve`` refuses a non-loopback address with neither a token nor mTLS, unless ``--insecure``.
* A whole fleet as two ``polar serve`` processes whose environments hold every role token (the gateway's holds
  only its own token and the internal token's digest): a ``command``-harness agent in the local bubblewrap
  sandbox (network ``proxy``) searches its environment, every ``/proc/*/environ`` and ``/proc/*/cmdline`` and
  the files it can read (the test's directory, with the services' logs and a secrets file, among them) for the
  tokens, and tries to reach the rollout server. It finds none and cannot connect; the credentials it does hold
  (the proxy's per-session HTTP token) are refused on every gRPC service.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from polar.common.v1 import status_pb2, task_pb2
from polar.gateway.v1 import gateway_service_pb2, gateway_service_pb2_grpc
from polar.proxy.v1 import model_proxy_service_pb2, model_proxy_service_pb2_grpc
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc as pb_grpc

from integration_tests.support.services import POLAR_ARGV, free_port, wait_serving
from polar_client import RolloutClient
from polar_core.channels import open_channel
from rollout_server.server import create_server
from rollout_server.settings import RolloutSettings

TRAINER = "trainer-" + "7c1d9a2f4b6e8035"
GATEWAY = "gateway-" + "e3b0c44298fc1c14"
INTERNAL = "internal-" + "9af8d2e1b7c35064"
TOKENS = (TRAINER, GATEWAY, INTERNAL)


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def _code(target: str, token: str, call: str, request: Any) -> tuple[grpc.StatusCode, str]:
    async with open_channel(target, auth_token=token) as channel:
        try:
            await getattr(pb_grpc.RolloutServiceStub(channel), call)(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


async def test_each_token_calls_only_its_roles_methods(tmp_path: Path) -> None:
    settings = RolloutSettings(
        state_dir=tmp_path / "state", trainer_token=TRAINER, gateway_token=GATEWAY, internal_token=INTERNAL
    )
    server, port = await create_server(settings)
    target = f"127.0.0.1:{port}"
    ok, denied, unauthenticated = (
        grpc.StatusCode.OK,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    )
    try:
        assert (await _code(target, TRAINER, "ListTasks", pb.ListTasksRequest()))[0] == ok
        code, message = await _code(target, GATEWAY, "ListTasks", pb.ListTasksRequest())
        assert code == denied
        assert message == "polar.rollout.v1.RolloutService/ListTasks needs role trainer; the caller has role gateway"
        for token in ("", "not-a-token", TRAINER + "x"):
            code, message = await _code(target, token, "ListTasks", pb.ListTasksRequest())
            assert code == unauthenticated
            assert "ListTasks" in message
            assert TRAINER not in message
        # Past authentication: an unregistered gateway's heartbeat is NOT_FOUND, not refused.
        heartbeat = pb.HeartbeatRequest(gateway_id="gw-x")
        assert (await _code(target, GATEWAY, "Heartbeat", heartbeat))[0] == grpc.StatusCode.NOT_FOUND
        assert (await _code(target, INTERNAL, "Heartbeat", heartbeat))[0] == denied
        register_proxy = pb.RegisterProxyRequest(proxy_id="p", address="127.0.0.1:1", backend="scripted")
        assert (await _code(target, TRAINER, "RegisterProxy", register_proxy))[0] == denied
        assert (await _code(target, GATEWAY, "RegisterProxy", register_proxy))[0] == denied
        assert (await _code(target, INTERNAL, "RegisterProxy", register_proxy))[0] == ok
        submit = pb.SubmitTaskRequest(task=_task("t-1", ["true"]))
        assert (await _code(target, GATEWAY, "SubmitTask", submit))[0] == denied
        # Health stays open to orchestrators.
        async with grpc.aio.insecure_channel(target) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(None)


def _serve(argv: list[str], env: Mapping[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")} | dict(env)
    return subprocess.run(
        [*POLAR_ARGV, "serve", *argv], env=full, cwd=cwd, capture_output=True, text=True, timeout=90, check=False
    )


def test_polar_serve_will_not_listen_unprotected_beyond_loopback(tmp_path: Path) -> None:
    argv = ["reconstructor", "--host", "0.0.0.0", "--port", "0", "--state-dir", str(tmp_path / "r"), "--check"]
    refused = _serve(argv, {}, tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "refusing to listen on 0.0.0.0 without authentication" in refused.stderr
    assert "--insecure" in refused.stderr
    assert "POLAR_RECONSTRUCTOR_GATEWAY_TOKEN" in refused.stderr
    allowed = _serve([*argv, "--insecure"], {}, tmp_path)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "all services healthy" in allowed.stdout


# The agent: one chat call (a session needs one), then the search, then one JSON line on stdout.
AGENT = r"""
import hashlib, json, os, re, socket, sys, time, urllib.request
digests, rollout, root = set(sys.argv[1].split(",")), sys.argv[2], sys.argv[3]
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": os.environ["POLAR_MODEL"], "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
)
urllib.request.urlopen(request, timeout=60).read()
words = re.compile(rb"[A-Za-z0-9_-]{8,}")
found, counts = [], {"proc": 0, "files": 0}
def scan(blob, where):
    for word in words.findall(blob):
        if hashlib.sha256(word).hexdigest() in digests:
            found.append(where)
scan("\n".join(f"{k}={v}" for k, v in os.environ.items()).encode(), "environment")
for pid in os.listdir("/proc"):
    for name in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                scan(f.read(), f"/proc/{pid}/{name}")
            counts["proc"] += 1
        except OSError:
            pass
deadline, left = time.monotonic() + 40, 30000
for top in [root, "/"]:
    for here, dirs, files in os.walk(top):
        if here == "/":
            dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev", "usr")]
        for name in files:
            path = os.path.join(here, name)
            try:
                if os.path.isfile(path) and os.path.getsize(path) <= 1 << 20:
                    with open(path, "rb") as f:
                        scan(f.read(), path)
                    counts["files"] += 1
            except OSError:
                pass
            left -= 1
        if left <= 0 or time.monotonic() > deadline:
            break
host, port = rollout.rsplit(":", 1)
try:
    socket.create_connection((host, int(port)), timeout=3).close()
    connect = "connected"
except OSError as exc:
    connect = type(exc).__name__
held = {k: v for k, v in os.environ.items() if re.search("KEY|TOKEN|SECRET|AUTH", k)}
print(json.dumps({"found": sorted(set(found)), "counts": counts, "connect": connect, "held": held}))
"""


def _task(task_id: str, argv: list[str]) -> task_pb2.Task:
    task = task_pb2.Task(
        task_id=task_id,
        instruction="Look around.",
        num_samples=1,
        timeout_seconds=150,
        harness=task_pb2.HarnessSpec(name="command"),
        runtime=task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_LOCAL),
        evaluator=task_pb2.EvaluatorSpec(strategy="session_completed"),
    )
    task.harness.options.update({"argv": argv})
    task.runtime.options.update({"isolation": "bwrap"})
    return task


class _Fleet:
    """Two ``polar serve`` processes: proxy, rollout, reconstructor and evaluator; and the gateway."""

    def __init__(self, root: Path) -> None:
        self.root = root
        names = ("proxy", "proxy_http", "rollout", "reconstructor", "evaluator", "gateway")
        self.ports = {name: free_port() for name in names}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def start(self, key: str, services: list[str], env: Mapping[str, str]) -> None:
        state = self.root / key
        state.mkdir(parents=True, exist_ok=True)
        full = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")} | dict(env)
        full["no_proxy"] = full["NO_PROXY"] = "*"
        argv = [*POLAR_ARGV, "-v", "serve", *services, "--state-dir", str(state), "--host", "127.0.0.1"]
        with (self.root / f"{key}.log").open("ab") as out:
            self.processes[key] = subprocess.Popen(
                argv, env=full, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=state
            )

    def logs(self) -> str:
        return "\n".join(
            f"===== {key} =====\n{(self.root / f'{key}.log').read_text(errors='replace')[-4000:]}"
            for key in self.processes
        )

    async def wait_healthy(self, names: list[str], limit_s: float = 120.0) -> None:
        deadline = time.monotonic() + limit_s
        for name in names:
            await wait_serving(self.address(name), name, deadline, self.logs)

    def stop(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[_Fleet]:
    f = _Fleet(tmp_path)
    every = {"TRAINER_TOKEN": TRAINER, "GATEWAY_TOKEN": GATEWAY, "INTERNAL_TOKEN": INTERNAL}
    env = {f"POLAR_{svc}_{k}": v for svc in ("PROXY", "ROLLOUT", "RECONSTRUCTOR") for k, v in every.items()}
    env |= {
        "POLAR_EVALUATOR_GATEWAY_TOKEN": GATEWAY,
        "POLAR_PROXY_PORT": str(f.ports["proxy"]),
        "POLAR_PROXY_BACKEND": "scripted",
        "POLAR_PROXY_BACKEND_OPTIONS": json.dumps({"turns": [{"text": "Hello."}]}),
        "POLAR_PROXY_MODEL": "tiny",
        "POLAR_PROXY_HTTP_HOST": "127.0.0.1",
        "POLAR_PROXY_HTTP_PORT": str(f.ports["proxy_http"]),
        "POLAR_PROXY_CONTEXT_LENGTH": "32768",
        "POLAR_ROLLOUT_PORT": str(f.ports["rollout"]),
        "POLAR_ROLLOUT_HEARTBEAT_INTERVAL_S": "0.5",
        "POLAR_ROLLOUT_DISPATCH_INTERVAL_S": "0.1",
        "POLAR_RECONSTRUCTOR_PORT": str(f.ports["reconstructor"]),
        "POLAR_EVALUATOR_PORT": str(f.ports["evaluator"]),
    }
    # An operator's secrets file on the host, as a hostile agent would hope to find one.
    (tmp_path / "secrets.env").write_text("".join(f"{k}={v}\n" for k, v in env.items() if "TOKEN" in k))
    (tmp_path / "no-clis").mkdir()
    f.start("services", ["proxy", "rollout", "reconstructor", "evaluator"], env)
    # The gateway holds its own token, and only the digest of the internal one (it verifies, never presents it).
    f.start(
        "gateway",
        ["gateway", "--port", str(f.ports["gateway"])],
        {
            "POLAR_GATEWAY_GATEWAY_TOKEN": GATEWAY,
            "POLAR_GATEWAY_INTERNAL_TOKEN": f"sha256:{_sha(INTERNAL)}",
            "POLAR_GATEWAY_GATEWAY_ID": "gw-roles",
            "POLAR_GATEWAY_PROXY_ADDRESS": f.address("proxy"),
            "POLAR_GATEWAY_RECONSTRUCTOR_ADDRESS": f.address("reconstructor"),
            "POLAR_GATEWAY_EVALUATOR_ADDRESS": f.address("evaluator"),
            "POLAR_GATEWAY_ROLLOUT_ADDRESS": f.address("rollout"),
            "POLAR_GATEWAY_RUNTIME_NETWORK": "proxy",
            "POLAR_GATEWAY_METRICS_PORT": "-1",
            "POLAR_GATEWAY_HARNESS_BIN_DIR": str(tmp_path / "no-clis"),
        },
    )
    try:
        await f.wait_healthy(["proxy", "rollout", "reconstructor", "evaluator", "gateway"])
        yield f
    finally:
        f.stop()


def _bwrap_works() -> bool:
    if shutil.which("bwrap") is None:
        return False
    probe = subprocess.run(
        ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "true"], capture_output=True, check=False
    )
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not _bwrap_works(), reason="bubblewrap cannot create a sandbox here")
@pytest.mark.skipif(shutil.which("python3") is None, reason="the agent script needs python3 on PATH")
async def test_a_sandboxed_agent_finds_no_control_plane_credential(fleet: _Fleet, tmp_path: Path) -> None:
    digests = ",".join(_sha(t) for t in TOKENS)
    argv = ["python3", "-c", AGENT, digests, fleet.address("rollout"), str(tmp_path)]
    async with RolloutClient(fleet.address("rollout"), token=TRAINER, timeout_s=10) as trainer:
        await trainer.submit(_task("snoop", argv))
        deadline = time.monotonic() + 200
        while (reply := await trainer.get("snoop")).task.status != status_pb2.TASK_STATUS_COMPLETED:
            assert time.monotonic() < deadline, fleet.logs()
            await asyncio.sleep(0.5)
    (result,) = reply.session_results
    assert result.status == "resolved", (result.status, result.error_message, result.harness_stderr, fleet.logs())
    report = json.loads(result.harness_stdout.strip().splitlines()[-1])
    assert report["found"] == [], report
    assert report["counts"]["proc"] > 0, report
    assert report["counts"]["files"] > 0, report
    assert report["connect"] != "connected", report  # network `proxy`: the host's ports are out of reach
    held = [v for v in report["held"].values() if v]
    assert held, report  # the proxy's per-session token, which is meant for the provider HTTP API only
    assert not set(held) & set(TOKENS)

    # Whatever it holds, tried where it cannot reach: refused by every service.
    for token in held:
        assert (await _code(fleet.address("rollout"), token, "ListTasks", pb.ListTasksRequest()))[0] == (
            grpc.StatusCode.UNAUTHENTICATED
        )
        async with open_channel(fleet.address("proxy"), auth_token=token) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await model_proxy_service_pb2_grpc.ModelProxyServiceStub(channel).ListCompletions(
                    model_proxy_service_pb2.ListCompletionsRequest(session_id=result.session_id), timeout=10
                )
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # The gateway's own token drives no other gateway and loads no weights.
    async with open_channel(fleet.address("gateway"), auth_token=GATEWAY) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gateway_service_pb2_grpc.GatewayServiceStub(channel).GetCapacity(
                gateway_service_pb2.GetCapacityRequest(), timeout=10
            )
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    async with open_channel(fleet.address("proxy"), auth_token=GATEWAY) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await model_proxy_service_pb2_grpc.ModelProxyServiceStub(channel).LoadWeights(
                model_proxy_service_pb2.LoadWeightsRequest(), timeout=10
            )
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
