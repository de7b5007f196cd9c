"""The five services as separate ``polar serve`` processes, for ``bench.long_sessions --processes``.

Each service runs in its own process (:class:`integration_tests.support.services.ServiceProcesses`), so its
resident memory (``VmRSS`` of ``/proc/PID/status``) is its own: the proxy's completion records, the gateway's
sessions, the reconstructor's traces and the rollout server's results are measured apart. The agents are the
gateway's child processes, not counted.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from integration_tests.support.services import ServiceProcesses, free_port

__all__ = ["SERVICES", "ProcessStack", "process_stack", "rss_of"]

HOST = "127.0.0.1"
SERVICES = ("rollout", "gateway", "proxy", "reconstructor", "evaluator")


def rss_of(pid: int) -> float:
    """The resident set size of process ``pid`` in MiB (0 when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class ProcessStack:
    """The running processes: the rollout server's address, the shared token and each service's pid."""

    def __init__(self, procs: ServiceProcesses, token: str) -> None:
        self.procs = procs
        self.token = token
        self.rollout_address = procs.services["rollout"].address

    def rss(self) -> dict[str, float]:
        """Each service's resident memory in MiB."""
        return {name: rss_of(self.procs.services[name].process.pid) for name in SERVICES}


@contextlib.asynccontextmanager
async def process_stack(root: Path, script: Path, *, context_length: int, workers: int) -> AsyncIterator[ProcessStack]:
    """Start rollout server, gateway, proxy (tiny tokenizer, scripted ``script``), reconstructor and evaluator."""
    token = secrets.token_urlsafe(24)
    ports = {name: free_port() for name in (*SERVICES, "proxy_http")}

    def address(name: str) -> str:
        return f"{HOST}:{ports[name]}"

    procs = ServiceProcesses(root)
    envs = {
        "rollout": {
            "POLAR_ROLLOUT_AUTH_TOKEN": token,
            "POLAR_ROLLOUT_GATEWAY_ADDRESSES": json.dumps([address("gateway")]),
            "POLAR_ROLLOUT_MAX_ATTEMPTS": "1",
            "POLAR_ROLLOUT_SESSION_GRACE_S": "600",
            "POLAR_ROLLOUT_DISPATCH_INTERVAL_S": "0.2",
            "POLAR_ROLLOUT_HEARTBEAT_INTERVAL_S": "2",
        },
        "proxy": {
            "POLAR_PROXY_AUTH_TOKEN": token,
            "POLAR_PROXY_BACKEND": "scripted",
            "POLAR_PROXY_BACKEND_OPTIONS": json.dumps({"script": str(script)}),
            "POLAR_PROXY_MODEL": "tiny",
            "POLAR_PROXY_CONTEXT_LENGTH": str(context_length),
            "POLAR_PROXY_HTTP_HOST": HOST,
            "POLAR_PROXY_HTTP_PORT": str(ports["proxy_http"]),
            "POLAR_PROXY_FSYNC": "false",
        },
        "reconstructor": {"POLAR_RECONSTRUCTOR_AUTH_TOKEN": token},
        "evaluator": {"POLAR_EVALUATOR_AUTH_TOKEN": token},
        "gateway": {
            "POLAR_GATEWAY_AUTH_TOKEN": token,
            "POLAR_GATEWAY_GATEWAY_ID": "bench",
            "POLAR_GATEWAY_PROXY_ADDRESS": address("proxy"),
            "POLAR_GATEWAY_RECONSTRUCTOR_ADDRESS": address("reconstructor"),
            "POLAR_GATEWAY_EVALUATOR_ADDRESS": address("evaluator"),
            "POLAR_GATEWAY_ROLLOUT_ADDRESS": address("rollout"),
            "POLAR_GATEWAY_RUNNING_WORKERS": str(workers),
            "POLAR_GATEWAY_INIT_WORKERS": "2",
            "POLAR_GATEWAY_POSTRUN_WORKERS": "2",
            "POLAR_GATEWAY_RUNTIME_NETWORK": "host",
            "POLAR_GATEWAY_METRICS_PORT": "-1",
        },
    }
    try:
        for name in ("rollout", "proxy", "reconstructor", "evaluator", "gateway"):
            procs.serve(name, name, HOST, ports[name], envs[name])
        await procs.wait_healthy(list(SERVICES), limit_s=180)
        yield ProcessStack(procs, token)
    finally:
        procs.kill_all()
