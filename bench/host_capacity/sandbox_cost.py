"""What a sandbox costs per session and per command, one column per isolation (bwrap, gvisor).

For each isolation, ``--sessions`` runtimes are started one after another; in each, ``--commands`` runs of
``true``, of ``python3 -c pass`` and of ``git status`` in a small repository, then ``stop``. Printed: the median
wall seconds of start, of each command and of stop, and the CPU seconds this process's children used per
session (the sandboxes: bubblewrap, or runsc with gVisor's Sentry and gofer). An isolation that cannot run here
shows its reason instead of figures.

Run: ``.venv/bin/python -m bench.host_capacity.sandbox_cost`` (``--json FILE`` also writes the numbers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from runtimes import Isolation, RuntimeSpec, create_runtime
from runtimes.local import probe_isolation

_COMMANDS = {"true": ["true"], "python3 -c pass": ["python3", "-c", "pass"], "git status": ["git", "status", "-s"]}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def measure(isolation: Isolation, sessions: int, commands: int, base: Path) -> dict[str, float] | str:
    """Median seconds of start, each command and stop over ``sessions`` runtimes; or why it cannot run here."""
    shortfall = (await probe_isolation(isolation)).shortfall(isolation)
    if shortfall is not None:
        return shortfall
    repo = base / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "a.py").write_text("print('hi')\n")
    await asyncio.to_thread(subprocess.run, ["git", "init", "-q", str(repo)], check=True)
    samples: dict[str, list[float]] = {"start": [], **{name: [] for name in _COMMANDS}, "stop": []}
    cpu0 = _children_cpu()
    for i in range(sessions):
        runtime = create_runtime(RuntimeSpec(isolation=isolation), session_id=f"cost-{i}", base_dir=base / "rt")
        t = time.perf_counter()
        await runtime.start()
        samples["start"].append(time.perf_counter() - t)
        await runtime.upload(repo, "repo")
        for name, argv in _COMMANDS.items():
            for _ in range(commands):
                result = await runtime.exec(argv, cwd="repo", timeout=120)
                if not result.ok:
                    raise RuntimeError(f"{name} failed under {isolation.value}: {result.stderr[-300:]}")
                samples[name].append(result.duration_s)
        t = time.perf_counter()
        await runtime.stop()
        samples["stop"].append(time.perf_counter() - t)
    out = {f"{name} s": statistics.median(values) for name, values in samples.items()}
    out["sandbox CPU-s/session"] = (_children_cpu() - cpu0) / sessions
    return out


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.host_capacity.sandbox_cost", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--isolation", nargs="+", default=["bwrap", "gvisor"], choices=["bwrap", "gvisor"])
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--commands", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results: dict[str, dict[str, float] | str] = {}
    with tempfile.TemporaryDirectory(prefix="polar-cost-") as name:
        for level in args.isolation:
            results[level] = await measure(Isolation(level), args.sessions, args.commands, Path(name) / level)
    print(
        f"host: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; {args.sessions} sessions x {args.commands} runs"
    )
    print("| | " + " | ".join(results) + " |")
    print("|---|" + "---:|" * len(results))
    rows = next((list(r) for r in results.values() if isinstance(r, dict)), [])
    for row in rows:
        cells = [f"{r[row]:.3f}" if isinstance(r, dict) else "-" for r in results.values()]
        print(f"| {row} | " + " | ".join(cells) + " |")
    for level, r in results.items():
        if isinstance(r, str):
            print(f"{level}: not measured: {r}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
