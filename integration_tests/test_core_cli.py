"""The ``polar`` command: ``serve --check`` on a subset of services, ``health``, and clean errors."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from polar_run.serve import service_spec

POLAR = [sys.executable, "-m", "polar_run"]


def test_serve_check_runs_a_subset_and_reports_health(tmp_path: Path) -> None:
    done = subprocess.run(
        [*POLAR, "serve", "reconstructor", "evaluator", "--check", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "health reconstructor  SERVING" in done.stdout
    assert "health evaluator      SERVING" in done.stdout
    assert "rollout" not in done.stdout


def test_unknown_service_is_a_clean_error() -> None:
    done = subprocess.run([*POLAR, "serve", "nope"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "unknown service 'nope'" in done.stderr
    assert "Traceback" not in done.stderr


async def test_health_command_against_a_live_server(tmp_path: Path) -> None:
    spec = service_spec("reconstructor")
    server, port = await spec.start(spec.settings_cls.load(state_dir=tmp_path))
    try:
        ok = await asyncio.create_subprocess_exec(
            *POLAR, "health", f"127.0.0.1:{port}", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, _ = await ok.communicate()
        assert ok.returncode == 0
        assert b"SERVING" in out
    finally:
        await server.stop(None)
    gone = await asyncio.create_subprocess_exec(
        *POLAR, "health", f"127.0.0.1:{port}", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, err = await gone.communicate()
    assert gone.returncode == 1
    assert b"UNAVAILABLE" in err


def test_serve_all_five_wires_them_together(tmp_path: Path) -> None:
    env = {**os.environ, "POLAR_PROXY_MODEL": "tiny"}
    done = subprocess.run(
        [*POLAR, "serve", "--check", "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for name in ("proxy", "reconstructor", "evaluator", "rollout", "gateway"):
        assert f"health {name:<14} SERVING" in done.stdout
    assert "control-plane token: " in done.stdout
    assert (tmp_path / "rollout").is_dir()
