"""Polar services as separate ``polar serve SERVICE`` processes: start, SIGKILL, wait for health, read logs.

Each process runs in a process group of its own (so a kill takes its children too) with its state directory
under ``root/<key>`` and its log at ``root/<key>.log``. ``prefix`` runs the command under another one (``ip netns
exec NS`` in the multi-host test).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from integration_tests.support.ports import free_port

__all__ = ["CHAT_AGENT", "POLAR_ARGV", "Service", "ServiceProcesses", "free_port", "wait_serving"]

# The ``polar`` command: what the installed script runs (``polar_run.cli:main``), from this checkout.
POLAR_ARGV = (sys.executable, "-m", "polar_run")


# A ``command``-harness agent: ``python3 -c CHAT_AGENT CALLS PAUSE STEP MOD`` makes CALLS chat calls through its
# host's proxy, writes an answer file, then sleeps PAUSE + STEP * (sample index % MOD) seconds (the index is read
# from the session directory's name), so that sessions finish staggered and tests can kill things mid-task.
CHAT_AGENT = """
import json, os, sys, time, urllib.request
index = int(os.environ["POLAR_SAMPLE_INDEX"])
calls, pause, step, mod = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
messages = []
for i in range(calls):
    messages.append({"role": "user", "content": f"step {i}"})
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": os.environ["POLAR_MODEL"], "messages": messages}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    reply = json.loads(urllib.request.urlopen(request, timeout=60).read())
    messages.append(reply["choices"][0]["message"])
open("answer.txt", "w").write("42\\n")
time.sleep(pause + step * (index % mod))
"""


@dataclasses.dataclass
class Service:
    """One ``polar serve`` process."""

    name: str
    address: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclasses.dataclass
class ServiceProcesses:
    """The ``polar serve`` processes of one test, by key."""

    root: Path
    services: dict[str, Service] = dataclasses.field(default_factory=dict)

    def serve(
        self,
        key: str,
        service: str,
        address: str,
        port: int,
        env: Mapping[str, str],
        *,
        prefix: Sequence[str] = (),
    ) -> Service:
        """Start ``polar serve SERVICE`` on ``address:port`` with ``env`` (no other ``POLAR_`` variable)."""
        state = self.root / key
        state.mkdir(parents=True, exist_ok=True)
        log = self.root / f"{key}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
        full_env.update(env)
        # grpc and urllib would honour a proxy from the environment; every address here is local.
        full_env["no_proxy"] = full_env["NO_PROXY"] = "*"
        argv = [*prefix, *POLAR_ARGV, "-v", "serve", service]
        argv += ["--state-dir", str(state), "--host", address, "--port", str(port)]
        with log.open("ab") as out:
            process = subprocess.Popen(
                argv, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=state
            )
        self.services[key] = Service(key, f"{address}:{port}", process, log)
        return self.services[key]

    def kill(self, key: str) -> None:
        """SIGKILL a service's whole process group (a crash: no graceful shutdown) and reap it."""
        service = self.services[key]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.process.pid, signal.SIGKILL)
        service.process.wait(timeout=30)

    def kill_all(self) -> None:
        """SIGKILL every service (teardown)."""
        for service in self.services.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(service.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                service.process.wait(timeout=30)

    def logs(self) -> str:
        """The tail of every service's log, for assertion messages."""
        parts = []
        for service in self.services.values():
            text = service.log.read_text(errors="replace") if service.log.exists() else ""
            parts.append(f"===== {service.name} (exit {service.process.poll()}) =====\n{text[-3000:]}")
        return "\n".join(parts)

    async def wait_healthy(self, keys: Sequence[str], limit_s: float = 90.0) -> None:
        """Wait until every named service answers its gRPC health check."""
        deadline = time.monotonic() + limit_s
        for key in keys:
            service = self.services[key]
            await wait_serving(service.address, key, deadline, self.logs, exited=service.process.poll)


async def wait_serving(
    address: str,
    name: str,
    deadline: float,
    logs: Callable[[], str],
    *,
    exited: Callable[[], int | None] | None = None,
) -> None:
    """Wait until the gRPC server at ``address`` answers SERVING to a health check, until ``deadline``.

    Args:
        address: The server's ``host:port``.
        name: What to call it in failures.
        deadline: ``time.monotonic()`` by which it must be serving.
        logs: Log tails for the assertion message.
        exited: The server process's exit status, ``None`` while it runs; a process that exits fails at once.
    """
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if exited is not None and (code := exited()) is not None:
                raise AssertionError(f"{name} exited with {code}\n{logs()}")
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not become healthy\n{logs()}")
            await asyncio.sleep(0.2)
