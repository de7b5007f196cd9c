"""A retried session's records in ``polar run`` and ``polar generate`` are its final attempt's, and only those.

A retried attempt records into its own proxy session (``<id>~attemptN``, ``gateway.models.proxy_session_id``).
Here the first attempt of ``paginate-off-by-one-0000`` makes two model calls whose first tells the ``command``
agent to delete its workspace, so collecting the patch fails: ``infra_error``, which the rollout server retries.
The second attempt (its own script: the scripted backend keys scripts by proxy session) fixes the bug. The run
directory must then hold exactly the second attempt's two calls, attributed to the session, and the same calls
as ``traces.jsonl``; ``polar generate`` must build its SFT record from the second attempt's last call, also
with ``--server`` on a fleet of ``polar serve`` processes (the fleet export path).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from integration_tests.support.polar_cli import AGENT, FIX_SCRIPT, PAGINATE, read_jsonl, run_polar, write_script
from integration_tests.support.services import Service
from integration_tests.test_generate_fleet import TOKEN, Fleet, generate_argv, run_env

pytestmark = [
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for workspaces"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is needed for the local runtime"),
]

SESSION = "paginate-off-by-one-0000"
# The first attempt's model: remove the workspace (the patch cannot be collected: infra_error), then answer.
_BREAK = 'cd / && rm -rf "$POLAR_WORKSPACE"'
BREAK_SCRIPT = [
    {"text": "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": _BREAK}}) + "\n</tool_call>"},
    {"text": "I removed the workspace."},
]


def _task(root: Path) -> Path:
    """The paginate task with the ``command`` agent, in ``root/paginate`` (its repository beside it)."""
    folder = root / "paginate"
    shutil.copytree(PAGINATE / "repo", folder / "repo")
    data = yaml.safe_load((PAGINATE / "task.yaml").read_text())
    data["evaluator"]["repo"] = "repo"
    data["harness"] = {"name": "command", "argv": ["python3", "-c", AGENT]}
    data["timeout_seconds"] = 60
    data["num_samples"] = 1
    path = folder / "task.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _backend_options(tmp: Path) -> list[str]:
    sessions = {
        SESSION: str(write_script(tmp / "break.jsonl", BREAK_SCRIPT)),
        f"{SESSION}~attempt2": str(write_script(tmp / "fix.jsonl", FIX_SCRIPT)),
    }
    return ["--backend", "scripted", "--model", "tiny", "--backend-option", f"sessions={json.dumps(sessions)}"]


def _check_final_attempt_only(out: Path, session: str = SESSION) -> list[dict[str, Any]]:
    """The run directory holds the second attempt's calls, exactly those of ``traces.jsonl``; return them."""
    (row,) = read_jsonl(out / "sessions.jsonl")
    assert (row["session_id"], row["status"], row["attempt"], row["calls"]) == (session, "resolved", 2, 2), row
    completions = read_jsonl(out / "completions.jsonl")
    traces = read_jsonl(out / "traces.jsonl")
    call_ids = [c["call_id"] for c in completions]
    assert len(call_ids) == len(set(call_ids)) == 2, completions
    assert sorted(call_ids) == sorted(c for t in traces for c in t["call_ids"])
    assert {c["session_id"] for c in completions} == {session}
    texts = json.dumps([c["response"] for c in completions])
    assert "rm -rf" not in texts  # nothing of the failed attempt
    assert "I removed the workspace" not in texts
    assert "I fixed page_count" in texts
    return completions


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_run_writes_the_final_attempts_records(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["run", str(_task(tmp_path)), "--out", str(out), *_backend_options(tmp_path), "--plain"]
    proc = run_polar(*argv, cwd=tmp_path, timeout_s=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    completions = _check_final_attempt_only(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["calls"] == len(completions) == 2
    assert summary["statistics"]["sessions_retried"] == 1


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_generate_exports_the_final_attempt(tmp_path: Path) -> None:
    _task(tmp_path / "dataset")
    out = tmp_path / "gen"
    argv = ["generate", str(tmp_path / "dataset"), "--out", str(out), *_backend_options(tmp_path), "--plain"]
    proc = run_polar(*argv, cwd=tmp_path, timeout_s=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_final_attempt_only(out)
    ledger = json.loads((out / "ledger.json").read_text())
    assert (ledger["totals"]["attempts"], ledger["totals"]["retries"], ledger["totals"]["accepted"]) == (2, 1, 1)
    (record,) = [r for split in ("train", "validation") for r in read_jsonl(out / "sft" / f"{split}.jsonl")]
    assert record["session_id"] == SESSION
    assert record["messages"][-1]["content"] == "I fixed page_count: it now rounds up."
    assert "rm -rf" not in json.dumps(record["messages"])


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_generate_on_a_fleet_exports_the_final_attempt(tmp_path: Path) -> None:
    run_id = "gen-retried"
    session = f"{run_id}.{SESSION}"
    turns = {session: BREAK_SCRIPT, f"{session}~attempt2": FIX_SCRIPT}
    dataset = tmp_path / "dataset"
    fleet = Fleet(tmp_path / "fleet")
    serve = fleet.procs.serve

    def serve_with_scripts(
        key: str, service: str, address: str, port: int, env: Mapping[str, str], **options: Any
    ) -> Service:
        # The fleet's proxy replays the two attempts' own scripts (keyed by proxy session); the task's repository
        # lies under the task roots of the services that check it.
        if service == "proxy":
            env = {**env, "POLAR_PROXY_BACKEND_OPTIONS": json.dumps({"sessions": turns})}
        if service in ("rollout", "gateway", "evaluator"):
            env = {**env, f"POLAR_{service.upper()}_TASK_ROOTS": json.dumps([str(dataset)])}
        return serve(key, service, address, port, env, **options)

    fleet.procs.serve = serve_with_scripts  # type: ignore[method-assign]
    try:
        fleet.start_rollout()
        await fleet.procs.wait_healthy(["rollout"])
        await fleet.procs.wait_healthy(fleet.start_gateway_host())
        _task(dataset)
        out = tmp_path / "gen"
        out.mkdir()
        # The run id is the sessions' prefix, so the scripts can name them: the manifest a first run would write.
        (out / "fleet.json").write_text(json.dumps({"run_id": run_id, "server": fleet.address("rollout")}))
        argv = generate_argv(dataset, out, fleet.address("rollout"), TOKEN)
        proc = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, env=run_env(), timeout=180, check=False
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr + fleet.procs.logs()
    finally:
        fleet.procs.kill_all()
    _check_final_attempt_only(out, session)
    (record,) = [r for split in ("train", "validation") for r in read_jsonl(out / "sft" / f"{split}.jsonl")]
    assert record["session_id"] == session
    assert record["messages"][-1]["content"] == "I fixed page_count: it now rounds up."
    assert "rm -rf" not in json.dumps(record["messages"])
