"""Start real inference servers (PyTriton, vLLM CPU) from their own virtual environments, for tests.

``scripts/setup_backends.sh`` creates ``.venv-triton`` and ``.venv-vllm`` in the repository root; the
functions here find them by that convention (:func:`backend_venv_python`), start a server on free ports,
wait for readiness with a deadline (never a blind sleep) and stop it with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from integration_tests.support.ports import free_ports

__all__ = ["ServerStartError", "backend_venv_python", "free_ports", "run_pytriton", "run_vllm"]

REPO_ROOT = Path(__file__).resolve().parents[2]
_PYTRITON_SERVER = Path(__file__).resolve().with_name("pytriton_server.py")


class ServerStartError(RuntimeError):
    """A test server exited or did not become ready in time; the message holds its log's tail."""


def backend_venv_python(kind: str, root: Path = REPO_ROOT) -> Path | None:
    """Return ``<root>/.venv-<kind>/bin/python`` when that environment exists, else None."""
    python = root / f".venv-{kind}" / "bin" / "python"
    return python if python.exists() else None


@contextlib.contextmanager
def _process(
    argv: list[str], env: dict[str, str], log_path: Path, ready: Callable[[subprocess.Popen[str]], bool],
    timeout_s: float, *, pipe_stdout: bool, extra_logs: tuple[Path, ...] = (),
) -> Iterator[float]:  # fmt: skip
    """Run ``argv``, poll ``ready`` until true or ``timeout_s``; yield the start-up time in seconds.

    Only a server that prints next to nothing may have its stdout piped: nobody drains the pipe later. A
    server that is still alive at the deadline gets SIGUSR1 first (a Python server with ``faulthandler``
    registered on it writes every thread's stack to its log), so the error says where it hung.
    """
    with log_path.open("w") as log:
        stdout = subprocess.PIPE if pipe_stdout else log
        proc = subprocess.Popen(argv, stdout=stdout, stderr=log, env=env, start_new_session=True, text=True)
        try:
            started = time.monotonic()
            while not ready(proc):
                if proc.poll() is not None or time.monotonic() - started > timeout_s:
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGUSR1)
                        time.sleep(1.0)
                    tails = [log_path.read_text(errors="replace")[-6000:]]
                    tails += [
                        f"--- {p.name}:\n{p.read_text(errors='replace')[-4000:]}" for p in extra_logs if p.exists()
                    ]
                    raise ServerStartError(f"{argv[2:4]} not ready (exit {proc.poll()}):\n" + "\n".join(tails))
            yield time.monotonic() - started
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            # Whatever the server started is in its session's process group (vLLM's engine core and workers):
            # it goes too, also when the server itself died first (a start-up that failed left them behind).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.stdout is not None:
                proc.stdout.close()


def _libdir(python: Path) -> str:
    code = "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"
    return subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def run_pytriton(
    python: Path,
    model_dir: Path | None,
    log_path: Path,
    *,
    scripted_ids: list[int] | None = None,
    model_name: str = "tiny",
    timeout_s: float = 180.0,
    attempts: int = 2,
) -> Iterator[tuple[str, float]]:
    """Serve ``model_dir`` (or, without one, ``scripted_ids``) on Triton with TensorRT-LLM tensor names.

    See ``pytriton_server.py``; with ``scripted_ids`` every call answers those IDs at once.

    A start that fails or hangs is retried on fresh ports, up to ``attempts`` times in all: on a loaded
    two-core machine tritonserver has once been seen not to come up within two minutes, and a test
    fixture should not fail on that. Each attempt's logs stay next to ``log_path`` (``.1``, ``.2``, ...).

    Yields:
        The gRPC ``host:port`` and the total start-up time in seconds. Models ``<model_name>`` (unary) and
        ``<model_name>_stream`` (decoupled) are loaded.
    """
    env = dict(os.environ)
    # The Python backend stub must load this interpreter's libpython, not the system one.
    env["LD_LIBRARY_PATH"] = _libdir(python)

    def ready(proc: subprocess.Popen[str]) -> bool:
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], 0.5)
        return bool(readable) and proc.stdout.readline().strip() == "READY"

    if (model_dir is None) == (scripted_ids is None):
        raise ValueError("run_pytriton needs a model_dir or scripted_ids, not both")
    source = ["--model-dir", str(model_dir)] if model_dir is not None else ["--scripted-ids", json.dumps(scripted_ids)]
    started = time.monotonic()
    for attempt in range(1, attempts + 1):
        grpc_port, http_port, metrics_port = free_ports(3)
        log = log_path if attempt == 1 else log_path.with_name(f"{log_path.name}.{attempt}")
        triton_log = log.with_name(f"{log.name}.tritonserver")
        argv = [
            str(python), str(_PYTRITON_SERVER), *source, "--model-name", model_name,
            "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--metrics-port", str(metrics_port),
            # Next to the log, so a killed server leaves nothing behind in ~/.cache.
            "--workspace", str(log.parent / f"pytriton-workspace-{attempt}"), "--triton-log", str(triton_log),
        ]  # fmt: skip
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(
                    _process(argv, env, log, ready, timeout_s, pipe_stdout=True, extra_logs=(triton_log,))
                )
            except ServerStartError as error:
                if attempt == attempts:
                    raise
                print(f"PyTriton start attempt {attempt} failed, retrying on fresh ports: {error}", file=sys.stderr)
                continue
            yield f"127.0.0.1:{grpc_port}", time.monotonic() - started
            return


@contextlib.contextmanager
def run_vllm(
    python: Path,
    model_dir: Path,
    log_path: Path,
    *,
    served_model_name: str = "tiny",
    max_model_len: int = 2048,
    extra_args: tuple[str, ...] = ("--dtype", "float32", "--logprobs-mode", "processed_logprobs"),
    timeout_s: float = 300.0,
    env: dict[str, str] | None = None,
) -> Iterator[tuple[str, float]]:
    """Serve ``model_dir`` with vLLM's OpenAI server on CPU (``env``: extra variables, e.g. ``VLLM_SERVER_DEV_MODE``).

    Yields:
        The base URL and the start-up time in seconds.
    """
    (port,) = free_ports(1)
    env = dict(os.environ) | dict(env or {})
    env.setdefault("VLLM_HOST_IP", "127.0.0.1")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", served_model_name, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(max_model_len), *extra_args,
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def ready(proc: subprocess.Popen[str]) -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=1.0).status_code == 200
        except httpx.TransportError:
            time.sleep(0.5)  # the server is not listening yet; poll again shortly
            return False

    with _process(argv, env, log_path, ready, timeout_s, pipe_stdout=False) as startup_s:
        yield url, startup_s
