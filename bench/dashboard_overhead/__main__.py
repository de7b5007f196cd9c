"""Benchmark: what the live dashboard costs a ``polar run``.

The same task (``examples/tasks/paginate`` with the scripted backend and the ``command`` agent of
``integration_tests/support/polar_cli.py``, ``--samples`` sessions) runs as a user runs it, ``polar run --plain`` in
a subprocess, in three modes, interleaved run by run so machine load hits them alike:

* ``off``: ``--no-dashboard``;
* ``on``: the default: the dashboard listens, nobody opens it;
* ``watched``: as ``on``, and a client logs in with the printed link and reads the event stream the whole run.

It prints each mode's median, min and max wall time (the process's, start to exit, and the run's own
``wall_seconds`` from ``summary.json``) and the ratios to ``off``. ``--startup N`` instead times what the
dashboard adds to a rollout server's start and stop, in process (``start_server`` then ``stop`` on a fresh
SQLite store, N times each way, interleaved; the dashboard's modules imported once beforehand, as a run
would have them after its first import).

Run: ``.venv/bin/python -m bench.dashboard_overhead [--runs 5] [--samples 4]`` or ``... --startup 20``.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import yaml

from integration_tests.support.polar_cli import AGENT, FIX_SCRIPT, PAGINATE, write_script

MODES = ("off", "on", "watched")


def _task(tmp: Path) -> tuple[Path, Path]:
    data = yaml.safe_load((PAGINATE / "task.yaml").read_text())
    shutil.copytree(PAGINATE / "repo", tmp / "repo", dirs_exist_ok=True)
    data["evaluator"]["repo"] = "repo"
    data["harness"] = {"name": "command", "argv": ["python3", "-c", AGENT]}
    data["timeout_seconds"] = 60
    path = tmp / "task.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, write_script(tmp / "fix.jsonl", FIX_SCRIPT)


def _watch(link: str, stop: threading.Event, events: list[int]) -> None:
    """Log in with the printed link and read the event stream until the run ends."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(link, timeout=10).read()  # ?token= -> cookie, redirected to the page
    base = link.split("?", 1)[0]
    try:
        with opener.open(base + "api/events", timeout=30) as stream:
            for line in stream:
                if line.startswith(b"event: snapshot"):
                    events[0] += 1
                if stop.is_set():
                    return
    except OSError:
        return  # the run ended and took the server with it


def _one(mode: str, task: Path, script: Path, out: Path, samples: int) -> tuple[float, float, int]:
    argv = [sys.executable, "-m", "polar_run", "run", str(task), "--out", str(out), "--overwrite", "--plain"]
    argv += ["--backend", "scripted", "--backend-option", f"script={script}", "--model", "tiny"]
    argv += ["--samples", str(samples)] + (["--no-dashboard"] if mode == "off" else [])
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=task.parent)
    stop, events, watcher = threading.Event(), [0], None
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if mode == "watched" and line.startswith("dashboard http") and watcher is None:
            watcher = threading.Thread(target=_watch, args=(line.split()[1], stop, events), daemon=True)
            watcher.start()
    code = proc.wait()
    elapsed = time.perf_counter() - started
    stop.set()
    if code != 0:
        raise SystemExit(f"polar run ({mode}) failed:\n{''.join(lines)}")
    wall = float(json.loads((out / "summary.json").read_text())["wall_seconds"])
    return elapsed, wall, events[0]


async def _start_stop(state: Path, dashboard: bool) -> float:
    from rollout_server.server import start_server
    from rollout_server.settings import RolloutSettings

    settings = RolloutSettings(
        port=0, state_dir=state, auth_token="bench", dashboard_address="127.0.0.1:0" if dashboard else ""
    )
    started = time.perf_counter()
    running = await start_server(settings)
    await running.stop(0)
    return time.perf_counter() - started


def _startup(runs: int) -> None:
    import asyncio

    import rollout_server.dashboard  # noqa: F401 - imported once, outside the timing

    times: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="polar-dash-start-") as tmp_name:
        for i in range(runs):
            for mode in times:
                state = Path(tmp_name) / f"{mode}-{i}"
                times[mode].append(asyncio.run(_start_stop(state, mode == "on")))
    print(f"rollout server start + stop in process, {runs} times each (ms)")
    print(f"{'dashboard':<11}{'median':>9}{'min':>9}{'max':>9}")
    for mode, values in times.items():
        ms = [v * 1000 for v in values]
        print(f"{mode:<11}{statistics.median(ms):>9.1f}{min(ms):>9.1f}{max(ms):>9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per mode (default 5)")
    parser.add_argument("--samples", type=int, default=4, help="sessions per run (default 4)")
    parser.add_argument("--startup", type=int, default=0, metavar="N", help="time server start/stop N times instead")
    args = parser.parse_args()
    if args.startup:
        _startup(args.startup)
        return
    times: dict[str, list[tuple[float, float, int]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="polar-dash-bench-") as tmp_name:
        tmp = Path(tmp_name)
        task, script = _task(tmp)
        for i in range(args.runs):
            for mode in MODES:
                times[mode].append(_one(mode, task, script, tmp / f"run-{mode}", args.samples))
                print(f"run {i + 1}/{args.runs} {mode:<8} {times[mode][-1][0]:.2f}s", file=sys.stderr, flush=True)
    print(f"polar run --plain, scripted backend, {args.samples} sessions, {args.runs} runs per mode (medians)")
    print(f"{'mode':<9}{'process s':>11}{'min':>8}{'max':>8}{'run wall s':>12}{'ratio':>8}{'events':>8}")
    base = statistics.median(t[0] for t in times["off"])
    for mode in MODES:
        proc_s = [t[0] for t in times[mode]]
        wall_s = [t[1] for t in times[mode]]
        row = f"{mode:<9}{statistics.median(proc_s):>11.2f}{min(proc_s):>8.2f}{max(proc_s):>8.2f}"
        row += f"{statistics.median(wall_s):>12.2f}{statistics.median(proc_s) / base:>8.3f}"
        print(row + f"{statistics.median(t[2] for t in times[mode]):>8.0f}")


if __name__ == "__main__":
    main()
