"""The servers of the benchmark, each in a process of its own: the stub, the proxy and LiteLLM's proxy.

``python -m bench.proxy_overhead.servers proxy ...`` is the proxy's process: a :class:`~model_proxy.app.ProxyApp`
(one uvicorn worker, one event loop) whose backend is either :class:`InstantBackend` (in process, answers at
once: the proxy's own cost), the ``vllm`` backend pointed at the stub (token IDs over HTTP, as in production) or
the ``triton`` backend pointed at a PyTriton server answering scripted IDs (token IDs as tensors over gRPC).
It prints its port and session tokens as one JSON line and serves until its standard input closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from bench.proxy_overhead.stub import CANNED
from integration_tests.support.backends import backend_venv_python, free_ports, run_pytriton
from model_proxy.app import ProxyApp
from model_proxy.backends.factory import create_backend
from model_proxy.models import GenerationChunk, GenerationRequest
from model_proxy.ports import Backend
from model_proxy.settings import ProxySettings
from polar_core.errors import FailedPrecondition
from polar_core.model_fixtures import build_tiny_tokenizer

__all__ = [
    "LITELLM",
    "TRITON_MODEL",
    "Child",
    "InstantBackend",
    "LiteLLM",
    "canned_ids",
    "start_child",
    "start_litellm",
    "start_triton",
]

LITELLM = Path(__file__).resolve().parents[2] / ".venv-litellm" / "bin" / "litellm"
TRITON_MODEL = "stub"
"""The unary model of the benchmark's PyTriton server (:func:`start_triton`)."""


def canned_ids(tok: Any) -> list[int]:
    """The stub's answer as token IDs (ending with the end-of-turn token)."""
    return [*tok.encode(CANNED, add_special_tokens=False), tok.convert_tokens_to_ids("<|im_end|>")]


class InstantBackend:
    """Answers every call at once with fixed IDs (no I/O)."""

    name = "instant"

    def __init__(self, ids: list[int]) -> None:
        self.ids = tuple(ids)
        self.logprobs = tuple(-0.1 for _ in ids)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        yield GenerationChunk(self.ids, self.logprobs, "stop")

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def healthy(self) -> bool:
        return True

    async def check_weights(self, path: str) -> str:
        raise FailedPrecondition("the instant backend cannot load weights")

    async def load_weights(self, path: str) -> None:
        raise FailedPrecondition("the instant backend cannot load weights")


class Child:
    """A server process that printed one JSON line of facts and serves until its stdin closes."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{cmd[:4]} exited before it was ready")
        self.info: dict[str, Any] = json.loads(line)

    def stop(self) -> str:
        """Close its stdin, wait, and return what else it printed."""
        out, _ = self.proc.communicate("", timeout=60)
        return out


def start_child(*args: str) -> Child:
    """Start ``python -m bench.proxy_overhead.<args>``."""
    return Child([sys.executable, "-m", *args])


class LiteLLM:
    """LiteLLM's proxy (``litellm --config``) in front of the stub, one worker."""

    def __init__(self, stub_port: int, workdir: Path) -> None:
        self.key = "sk-bench-" + secrets.token_hex(16)
        (self.port,) = free_ports(1)
        config = workdir / "litellm.yaml"
        config.write_text(
            "model_list:\n"
            "  - model_name: policy\n"
            "    litellm_params:\n"
            "      model: openai/policy\n"
            f"      api_base: http://127.0.0.1:{stub_port}/v1\n"
            "      api_key: sk-stub\n"
            "general_settings:\n"
            f"  master_key: {self.key}\n"
        )
        # Offline: use the bundled model cost map instead of fetching it; no telemetry.
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
        cmd = [str(LITELLM), "--config", str(config), "--host", "127.0.0.1", "--port", str(self.port)]
        self.log = (workdir / "litellm.log").open("w")
        self.proc = subprocess.Popen(
            [*cmd, "--num_workers", "1"], stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=workdir
        )

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"litellm exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"litellm did not listen within {timeout_s:.0f} s; see {self.log.name}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def start_litellm(stub_port: int, workdir: Path) -> tuple[LiteLLM | None, str]:
    """Start LiteLLM's proxy, or return None and why not."""
    if not LITELLM.exists() or shutil.which(str(LITELLM)) is None:
        return None, f"{LITELLM} is missing (run scripts/setup_litellm.sh)"
    server = LiteLLM(stub_port, workdir)
    try:
        server.wait_ready()
    except RuntimeError as exc:
        server.stop()
        return None, str(exc)
    return server, ""


@contextlib.contextmanager
def start_triton(ids: list[int], workdir: Path) -> Iterator[tuple[str | None, str]]:
    """Serve ``ids`` as scripted answers on PyTriton (``.venv-triton``).

    Yields:
        Its gRPC ``host:port`` and ``""``, or None and why it cannot run.
    """
    python = backend_venv_python("triton")
    if python is None:
        yield None, "no .venv-triton (run scripts/setup_backends.sh triton)"
        return
    with run_pytriton(python, None, workdir / "triton.log", scripted_ids=ids, model_name=TRITON_MODEL) as (url, _):
        yield url, ""


async def _serve_proxy(fsync: bool, stub_port: int, triton_url: str, sessions: int) -> None:
    tok = build_tiny_tokenizer()
    state = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    settings = ProxySettings(state_dir=state, fsync=fsync, context_length=1 << 20)
    backend: Backend
    if stub_port:
        backend = create_backend("vllm", {"url": f"http://127.0.0.1:{stub_port}", "model": "policy"}, tok)
    elif triton_url:
        backend = create_backend("triton", {"url": triton_url, "model_name": TRITON_MODEL}, tok)
    else:
        backend = InstantBackend(canned_ids(tok))
    app = ProxyApp(settings, backend, tok)
    port = await app.start()
    tokens = [(await app.registry.open(f"s{i}", "policy"))[1] for i in range(sessions)]
    print(json.dumps({"port": port, "tokens": tokens}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    records = sum(len(app.registry.get(f"s{i}").records) for i in range(sessions))
    print(json.dumps({"records": records}), flush=True)
    await app.close()
    shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="a benchmark server process")
    parser.add_argument("kind", choices=["proxy"])
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument("--stub-port", type=int, default=0, help="use the vllm backend against this stub")
    parser.add_argument("--triton-url", default="", help="use the triton backend against this gRPC host:port")
    parser.add_argument("--sessions", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(_serve_proxy(not args.no_fsync, args.stub_port, args.triton_url, args.sessions))


if __name__ == "__main__":
    main()
