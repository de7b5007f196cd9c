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

from integration_tests.support.polar_cli import AGENT, FIX_SCRIPT, PAGINATE, write_script
from polar_client import RolloutClient, task_from_mapping
from polar_run.embedded import EmbeddedStack, StackOptions
from polar_run.run_config import RunOverrides, prepare_task

BROWSER_DIR = Path(__file__).with_name("browser")
CHROMIUM = Path("/usr/bin/chromium")
SESSIONS = 6
WINDOW_S = 3600.0
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


def _shots_dir(tmp: Path) -> Path:
    """Where the screenshots go: ``$POLAR_DASHBOARD_SCREENSHOTS`` (e.g. ``docs/img``), else ``tmp``; absolute,
    since the browser script runs in ``browser/``."""
    shots = Path(os.environ.get("POLAR_DASHBOARD_SCREENSHOTS") or tmp).absolute()
    shots.mkdir(parents=True, exist_ok=True)
    return shots


class _Browser:
    """``browser/dashboard_check.mjs`` running: its stdout is one JSON object per line, each with a ``phase``."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.report: dict[str, Any] | None = None

    @classmethod
    async def start(cls, url: str, token: str, shots: Path) -> _Browser:
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
            limit=16 * 2**20,  # the report is one line
        )
        return cls(proc)

    async def reached(self, phase: str) -> bool:
        """Wait until the page has reached ``phase``; False when the script reported (it ended) first."""
        assert self.proc.stdout is not None
        while self.report is None:
            line = await asyncio.wait_for(self.proc.stdout.readline(), 330)
            if not line:
                raise AssertionError("the browser script ended without a report")
            message: dict[str, Any] = json.loads(line)
            if message["phase"] == "report":
                self.report = message
            elif message["phase"] == phase:
                return True
        return False

    async def finish(self) -> dict[str, Any]:
        """The script's report, once it has exited."""
        await self.reached("report")
        _, stderr = await asyncio.wait_for(self.proc.communicate(), 60)
        assert self.proc.returncode == 0, stderr.decode()
        assert self.report is not None
        return self.report


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
    shots = _shots_dir(tmp_path)
    results: list[Any] = []
    async with EmbeddedStack.start(options) as stack:
        base, _, key = stack.dashboard_url.partition("?token=")
        assert key
        assert base.startswith("http://127.0.0.1:")
        assert stack.dashboard is not None
        # The model-call tiles cover a sliding window (a minute by default, tested in the unit tests); here it spans
        # the whole run, so what the mid-run tiles show cannot depend on how long a loaded machine takes to get there.
        stack.dashboard.hub.proxies.window_s = WINDOW_S
        browser = await _Browser.start(base, key, shots)
        try:
            # The task goes in once the page shows its first snapshot: the dashboard's first read of the proxy's
            # metrics comes before every model call, so the mid-run rates count the calls of a finished session.
            if await browser.reached("watching"):
                async with RolloutClient(stack.rollout_address, token=stack.token) as client:
                    await client.submit(task_from_mapping(prepared.task))
                    results = [r async for r in client.watch("dashboard-demo")]
                await browser.reached("final")  # the page showed every session done; now the stack stops
        except BaseException:
            browser.proc.kill()
            raise
    report = await browser.finish()
    assert report["errors"] == [], "\n".join(report["errors"])
    statuses = sorted(r.status for r in results)
    assert statuses == sorted(["resolved"] * 3 + ["unresolved"] * 2 + ["agent_timeout"])

    # Refused without a session: the page shows the login form; the JSON and the stream answer 401.
    assert report["unauthenticated"] == {"page": 401, "login_form": 1, "api": 401, "events": 401, "bad_token": 401}
    assert report["logged_in_url"] == base
    assert {"name": "polar_dashboard", "httpOnly": True, "sameSite": "Strict"} in report["cookie"]
    assert report["after_logout"] == 401

    # Every snapshot the page rendered (not samples): the stage tiles partition the sessions (nothing before the
    # task, all six after), sessions were seen in flight, and the done count rose to six through mid-run values.
    renders = report["renders"]
    assert [r["seq"] for r in renders] == sorted({r["seq"] for r in renders})
    stages = ("pending", "starting", "running", "postrun", "done")
    assert {sum(r[s] for s in stages) for r in renders} <= {0, SESSIONS}
    assert any(r["pending"] + r["starting"] + r["running"] + r["postrun"] > 0 for r in renders)
    assert len({r["done"] for r in renders}) >= 3
    assert [r["done"] for r in renders] == sorted(r["done"] for r in renders)
    # The policy version is the fleet's 0 (no update yet), not "–".
    assert {r["version"] for r in renders} == {"0"}
    final = report["final"]
    assert (final["done"], final["pending"], final["starting"], final["running"], final["postrun"]) == (
        SESSIONS,
        0,
        0,
        0,
        0,
    )
    assert final["policy_version"] == "0"
    # One vocabulary: the tiles name the stages the gateways table shows (running is the agent, postrun apart).
    assert [label for label in final["tile_labels"] if label in stages] == list(stages)
    assert all(f"{stage} " in final["gateways"][0][2] for stage in ("init", "ready", "running", "postrun"))

    # Mid-run: the first snapshot the page rendered after a session finished.
    mid = report["mid"]
    assert 1 <= mid["done"] < SESSIONS
    assert mid["reward_points_chart"] < SESSIONS  # one point per session finished by then
    # The model-call tiles read the embedded proxy's Prometheus endpoint, whose first read came before any call;
    # a finished session's calls are in the window: p50 / p90 / p99 (in ms under a second) and sampled tokens/s.
    assert re.match(r"[0-9.]+ / [0-9.]+ / [0-9.]+ m?s$", mid["latency"]), mid["latency"]
    assert float(mid["tokens"]) > 0, mid["tokens"]
    # The sessions-over-time chart, built from the stream's first full history and the new points after it: one
    # point per snapshot, none lost or doubled, the "done" line rising to all six.
    line = final["done_line"]
    assert len(line) == final["history_points"] >= final["snapshots"]
    assert line == sorted(line)
    assert line[-1] == SESSIONS
    assert mid["done_line"] == line[: len(mid["done_line"])]

    # What a person reads at the end: every finished session with its status, one reward point each.
    assert sorted(row[1] for row in final["recent"]) == statuses
    assert final["status_chart"] == {"agent_timeout": 1, "resolved": 3, "unresolved": 2}
    assert final["reward_points_chart"] == final["reward_points_attr"] == SESSIONS
    assert [row[1] for row in final["failing"]] == ["agent_timeout"]
    assert final["tasks"][0][:2] == ["dashboard-demo", "completed"]
    assert final["connection"] == "live"
    assert final["warning"] == ""  # loopback with a key: nothing to warn about
    note = final["proxy_note"]
    assert re.match(rf"Model-call figures from http://127\.0\.0\.1:\d+/metrics, over the last {WINDOW_S:.0f} s$", note)
    assert (shots / "dashboard-mid-run.png").stat().st_size > 10_000
    assert (shots / "dashboard-end.png").stat().st_size > 10_000

    # The stack stopped: the page says the run finished (and stops), it never showed a lost connection.
    end = report["end"]
    assert end["connection"] == "finished", end
    assert end["badges"] == ["live", "finished"], end
    assert end["updated"].startswith("the server stopped at ")
