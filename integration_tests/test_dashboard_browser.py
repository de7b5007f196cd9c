"""The live dashboard in a real browser: Debian's Chromium driven by playwright-core (node) over a running stack.

The embedded stack runs in this process with the scripted backend and the ``command`` harness; a task of six
sessions is scripted so that three are resolved, two unresolved and one hits its agent timeout. While it runs,
``browser/dashboard_check.mjs`` visits the dashboard as a person would (refused without a session, logs in with
the form, watches the tiles, charts and tables, logs out) and reports what it saw; this test asserts on it.

Needs ``/usr/bin/chromium`` (``apt-get install chromium``) and ``integration_tests/browser/node_modules``
(``scripts/setup.sh`` runs ``npm ci`` there); skipped with the reason otherwise. With
``POLAR_DASHBOARD_SCREENSHOTS=docs/img`` the screenshots land there (``docs/observability.md`` shows them).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from integration_tests.test_polar_run import AGENT, FIX_SCRIPT, PAGINATE, write_script
from polar_client import RolloutClient, task_from_mapping
from polar_run.embedded import EmbeddedStack, StackOptions
from polar_run.run_config import RunOverrides, prepare_task

BROWSER_DIR = Path(__file__).with_name("browser")
CHROMIUM = Path("/usr/bin/chromium")
SESSIONS = 6
# Per session (attempt 1 replays its own script): 0,2,4 fix the bug; 1,5 answer without a change; 3 stalls.
WRONG = [{"text": "I looked and found nothing to change."}]
STALL = [
    {"text": "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": "sleep 120"}}) + "\n</tool_call>"},
    {"text": "done"},
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(400),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Chromium is not installed (apt-get install chromium)"),
    pytest.mark.skipif(
        not (BROWSER_DIR / "node_modules" / "playwright-core").is_dir(),
        reason="playwright-core is not installed (npm ci in integration_tests/browser; scripts/setup.sh does it)",
    ),
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is needed for the local runtime"),
]


def _task(tmp: Path) -> tuple[Path, dict[str, Any]]:
    """The paginate task with a slow command agent, and per-session scripts for the scripted backend."""
    data = yaml.safe_load((PAGINATE / "task.yaml").read_text())
    shutil.copytree(PAGINATE / "repo", tmp / "repo", dirs_exist_ok=True)
    data["task_id"] = "dashboard-demo"
    data["evaluator"]["repo"] = "repo"
    data["num_samples"] = SESSIONS
    data["timeout_seconds"] = 15
    # A second's pause before the agent starts, so the stage counts can be seen moving.
    data["harness"] = {"name": "command", "argv": ["python3", "-c", "import time; time.sleep(1.5)\n" + AGENT]}
    path = tmp / "task.yaml"
    path.write_text(yaml.safe_dump(data))
    wrong = write_script(tmp / "wrong.jsonl", WRONG)
    sessions = {f"dashboard-demo-{i:04d}": str(wrong) for i in (1, 5)}
    sessions["dashboard-demo-0003"] = str(write_script(tmp / "stall.jsonl", STALL))
    return path, {"script": str(write_script(tmp / "fix.jsonl", FIX_SCRIPT)), "sessions": sessions}


async def _drive_browser(url: str, token: str, shots: Path) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(BROWSER_DIR / "dashboard_check.mjs"),
        url,
        token,
        str(SESSIONS),
        str(shots),
        cwd=BROWSER_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 330)
    assert proc.returncode == 0, stderr.decode()
    report: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    return report


async def test_dashboard_in_chromium(tmp_path: Path) -> None:
    task_file, backend_options = _task(tmp_path)
    prepared = prepare_task(task_file, RunOverrides(backend="scripted", backend_options=backend_options))
    options = StackOptions(
        state_dir=tmp_path / "state",
        model="tiny",
        backend="scripted",
        backend_options=prepared.backend_options,
        running_workers=2,
        task_roots=(tmp_path,),
        dashboard=True,
    )
    shots = Path(os.environ.get("POLAR_DASHBOARD_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - before anything runs
    async with EmbeddedStack.start(options) as stack:
        base, _, key = stack.dashboard_url.partition("?token=")
        assert key
        assert base.startswith("http://127.0.0.1:")
        browser = asyncio.create_task(_drive_browser(base, key, shots))
        async with RolloutClient(stack.rollout_address, token=stack.token) as client:
            await client.submit(task_from_mapping(prepared.task))
            results = [r async for r in client.watch("dashboard-demo")]
        report = await browser
    assert report["errors"] == [], "\n".join(report["errors"])
    statuses = sorted(r.status for r in results)
    assert statuses == sorted(["resolved"] * 3 + ["unresolved"] * 2 + ["agent_timeout"])

    # Refused without a session: the page shows the login form; the JSON and the stream answer 401.
    assert report["unauthenticated"] == {"page": 401, "login_form": 1, "api": 401, "events": 401, "bad_token": 401}
    assert report["logged_in_url"] == base
    assert {"name": "polar_dashboard", "httpOnly": True, "sameSite": "Strict"} in report["cookie"]
    assert report["after_logout"] == 401

    # The stage counts moved: sessions were seen queued or in flight, then all done.
    samples = report["samples"]
    assert any(s["pending"] + s["starting"] + s["running"] > 0 for s in samples)
    assert len({s["done"] for s in samples}) >= 3
    final = report["final"]
    assert (final["done"], final["pending"], final["running"]) == (SESSIONS, 0, 0)
    assert report["mid"]["reward_points_chart"] < SESSIONS
    # The sessions-over-time chart, built from the stream's first full history and the new points after it: one
    # point per snapshot, none lost or doubled, the "done" line rising to all six.
    line = final["done_line"]
    assert len(line) == final["history_points"] >= final["snapshots"]
    assert line == sorted(line)
    assert line[-1] == SESSIONS
    assert report["mid"]["done_line"] == line[: len(report["mid"]["done_line"])]

    # What a person reads at the end: every finished session with its status, one reward point each.
    assert sorted(row[1] for row in final["recent"]) == statuses
    assert final["status_chart"] == {"agent_timeout": 1, "resolved": 3, "unresolved": 2}
    assert final["reward_points_chart"] == final["reward_points_attr"] == SESSIONS
    assert [row[1] for row in final["failing"]] == ["agent_timeout"]
    assert final["tasks"][0][:2] == ["dashboard-demo", "completed"]
    assert final["connection"] == "live"
    assert final["warning"] == ""  # loopback with a key: nothing to warn about
    # The model-call tiles read the embedded proxy's Prometheus endpoint: reachable, and mid-run (a session has
    # finished, so its calls are inside the last minute's window) showing p50 / p90 / p99 (in ms under a second).
    note = final["proxy_note"]
    assert re.match(r"Model-call figures from http://127\.0\.0\.1:\d+/metrics, over the last 60 s$", note), note
    assert re.match(r"[0-9.]+ / [0-9.]+ / [0-9.]+ m?s$", report["mid"]["latency"]), report["mid"]["latency"]
    assert float(report["mid"]["tokens"]) > 0, report["mid"]["tokens"]  # sampled tokens per second over the window
    assert (shots / "dashboard-mid-run.png").stat().st_size > 10_000
    assert (shots / "dashboard-end.png").stat().st_size > 10_000
