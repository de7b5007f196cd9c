"""Benchmark: what the live dashboard costs a ``polar run``.

The same task (``examples/tasks/paginate`` with the scripted backend and the ``command`` agent of
``integration_tests/test_polar_run.py``, ``--samples`` sessions) runs as a user runs it, ``polar run --plain`` in
a subprocess, in three modes, interleaved run by run so machine load hits them alike:

* ``off``: ``--no-dashboard``;
* ``on``: the default: the dashboard listens, nobody opens it;
* ``watched``: as ``on``, and a client logs in with the printed link and reads the event stream the whole run.

It prints each mode's median, min and max wall time (the process's, start to exit, and the run's own
``wall_seconds`` from ``summary.json``) and the ratios to ``off``.

Run: ``.venv/bin/python -m bench.dashboard_overhead [--runs 5] [--samples 4]``.
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

from integration_tests.test_polar_run import AGENT, FIX_SCRIPT, PAGINATE, write_script

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per mode (default 5)")
    parser.add_argument("--samples", type=int, default=4, help="sessions per run (default 4)")
    args = parser.parse_args()
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
