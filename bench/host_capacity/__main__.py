"""Benchmark a host full of sessions: N concurrent real ``pi`` sessions on one gateway host.

Each N starts its own four ``polar serve`` processes (proxy with the scripted backend on the tiny model,
reconstructor, evaluator, gateway), so each service's CPU, peak resident memory and open file descriptors are
measured separately, from ``/proc``. N sessions of the paginate example task (``examples/tasks/paginate``,
evaluated by the ``swe`` strategy: the task's pytest suite on the agent's patch) are started at once on the
gateway; every session runs the real pi CLI in the local bubblewrap sandbox, reaching the proxy only through
the gateway's Unix-socket tunnel, through a scripted tool loop of ``--calls`` model calls (``--calls`` - 1
bash tool calls, one of which fixes the bug, then a final answer). The gateway runs up to N harnesses at once;
its INIT and POSTRUN pools keep their defaults (or ``--init-workers`` / ``--postrun-workers``).

Printed per N: sessions/s (N over the time from the first StartSession to the last result), stage latencies
p50/p99 from the session results' timings (INIT, RUN, POSTRUN, total), CPU seconds per session of each service
(its own, from ``/proc``) and of the sandboxes the gateway and the evaluator start (pi, the tunnel forwarder,
git, pytest: each service runs in a ``cpuacct`` cgroup of its own, which its descendants inherit; where no such
cgroup can be made, what ``/proc`` showed of them while they lived, a lower bound), the whole machine's busy CPU
seconds per session (other work on the machine included), peak RSS and peak open fds of each service, and after
the run, left-over processes (any process whose command line or working directory lies under the run's
directory) and left-over sandbox directories (must both be 0). A ratio column compares each N with the first
N of the same run.

Run: ``.venv/bin/python -m bench.host_capacity --n 8 32 64`` (``--json FILE`` also writes the numbers).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polar.common.v1 import session_pb2, status_pb2
from polar.gateway.v1 import gateway_service_pb2 as pb
from polar.gateway.v1 import gateway_service_pb2_grpc as pb_grpc

from integration_tests.support.harnesses import BIN_DIR, clis_installed, tool_call_turn
from integration_tests.support.services import ServiceProcesses, free_port
from polar_client.taskfile import load_task
from polar_core.channels import open_channel
from runtimes.spec import RuntimeSpec

REPO = Path(__file__).resolve().parents[2]
TASK_FILE = REPO / "examples" / "tasks" / "paginate" / "task.yaml"
SERVICES = ("proxy", "reconstructor", "evaluator", "gateway")
_SANDBOX_ROOT = RuntimeSpec().container_root  # where a bubblewrap sandbox sees its session directory
_TICK = os.sysconf("SC_CLK_TCK")
_FIX = "sed -i 's|return total // per_page|return -(-total // per_page)|' pagination.py"
_COMMANDS = ("ls", "cat pagination.py", "grep -n 'def page_count' pagination.py", "head -20 tests/test_pagination.py",
             _FIX, "grep -n return pagination.py", "git status --short", "git diff --stat",
             "wc -l pagination.py")  # fmt: skip


def script(calls: int) -> list[dict[str, Any]]:
    """``calls - 1`` bash tool calls (the fix among them), then the final answer."""
    if calls < 2:
        raise ValueError("a tool loop needs at least 2 calls")
    commands = [_COMMANDS[i % len(_COMMANDS)] for i in range(calls - 1)]
    if _FIX not in commands:
        commands[-1] = _FIX
    turns = [tool_call_turn("pi", c) for c in commands]
    return [*turns, {"text": "page_count now counts a partial last page."}]


# ----------------------------------------------------------------------------------------- /proc readings


def _stat(pid: int) -> tuple[float, float]:
    """(own CPU s, reaped children's CPU s) of ``pid``."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    return (utime + stime) / _TICK, (cutime + cstime) / _TICK


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _host_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + parts[4]
    return (sum(parts) - idle) / _TICK, sum(parts) / _TICK


_CPUACCT = Path("/sys/fs/cgroup/cpuacct")


@dataclasses.dataclass
class CpuAccount:
    """A cgroup-v1 ``cpuacct`` group holding one service and every process it starts (``None`` path: unavailable).

    The exact CPU of a service with its sandboxes: a sandboxed process killed with its pid namespace is never
    reaped by the service, so the service's children's times in ``/proc`` miss it.
    """

    path: Path | None

    @classmethod
    def create(cls, name: str) -> CpuAccount:
        path = _CPUACCT / name
        try:
            path.mkdir()
        except OSError:
            return cls(None)
        return cls(path)

    def add(self, pid: int) -> None:
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(pid))

    def seconds(self) -> float | None:
        if self.path is None:
            return None
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def remove(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.rmdir()


def leftover_processes(root: Path, exclude: set[int]) -> list[str]:
    """Processes whose command line or working directory lies under ``root`` (the services excluded)."""
    marker = str(root)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if marker in cmdline or cwd.startswith(marker):
            found.append(f"{entry}: {cmdline[:120]}")
    return found


def leftover_sandboxes(root: Path) -> list[str]:
    """Session directories left under the gateway's and the evaluator's runtime directories."""
    left = []
    for service in ("gateway", "evaluator"):
        runtimes = root / service / "runtimes"
        if runtimes.is_dir():
            left += [f"{service}/{p.name}" for p in runtimes.iterdir()]
    return left


def _sandbox_cpu(
    root: Path, owners: Mapping[int, str], seen: dict[tuple[str, str], tuple[str, float]], peak: list[int]
) -> None:
    """Record the CPU seconds of every live sandbox process of the gateway or the evaluator.

    A process is a sandbox's when it works in a session directory: under ``root/<owner>/runtimes`` as the host
    sees it, or at ``container_root`` (``/polar/session``) inside a bubblewrap sandbox, where its owner is the
    service process (``owners``: pid -> name) it descends from.
    """
    stats: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stats[int(entry)] = Path(f"/proc/{entry}/stat").read_text()
    parents = {pid: int(text[text.rindex(")") + 2 :].split()[1]) for pid, text in stats.items()}

    def owner_of(pid: int) -> str | None:
        for _ in range(64):
            if pid in owners:
                return owners[pid]
            pid = parents.get(pid, 0)
            if pid <= 1:
                return None
        return None

    live = 0
    for pid, text in stats.items():
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        host = next((o for o in ("gateway", "evaluator") if cwd.startswith(str(root / o / "runtimes"))), None)
        owner = host or (owner_of(pid) if cwd.startswith(_SANDBOX_ROOT) else None)
        if owner not in ("gateway", "evaluator"):
            continue
        fields = text[text.rindex(")") + 2 :].split()
        comm = text[text.index("(") + 1 : text.rindex(")")]
        # pid and start time name one process; its name may change (pi sets its title once started)
        seen[(owner, f"{pid}/{fields[19]}")] = (comm, (int(fields[11]) + int(fields[12])) / _TICK)
        live += 1
    peak[0] = max(peak[0], live)


@dataclasses.dataclass
class Sampler:
    """Samples open fds of each service, and the CPU of sandbox processes, while a run goes on.

    A sandboxed process's CPU is read from ``/proc`` while it lives (every 0.2 s), because processes killed with
    their sandbox's pid namespace are never reaped by the service, so its children's times miss them: the
    sandbox figures are a lower bound (processes shorter than a sample, like single git commands, are missed).
    """

    root: Path
    pids: Mapping[str, int]
    peak_fds: dict[str, int] = dataclasses.field(default_factory=dict)
    seen: dict[tuple[str, str], tuple[str, float]] = dataclasses.field(default_factory=dict)
    peak_sandbox_processes: list[int] = dataclasses.field(default_factory=lambda: [0])

    async def run(self) -> None:
        while True:
            for name, pid in self.pids.items():
                self.peak_fds[name] = max(self.peak_fds.get(name, 0), _fds(pid))
            owners = {pid: name for name, pid in self.pids.items()}
            _sandbox_cpu(self.root, owners, self.seen, self.peak_sandbox_processes)
            await asyncio.sleep(0.2)

    def cpu(self, owner: str) -> float:
        return sum(v for (o, _), (_, v) in self.seen.items() if o == owner)

    def by_program(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for (owner, _), (comm, value) in self.seen.items():
            name = f"{owner}:{comm}"
            out[name] = out.get(name, 0.0) + value
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# ----------------------------------------------------------------------------------------- one run


@dataclasses.dataclass
class Result:
    """One N's measurements."""

    n: int
    wall_s: float
    statuses: dict[str, int]
    timings: dict[str, list[float]]
    cpu: dict[str, float]
    peak_rss_mb: dict[str, float]
    peak_fds: dict[str, int]
    host_busy: float
    host_cpu_s: float
    leaked_processes: list[str]
    leaked_sandboxes: list[str]
    calls: list[int]
    peak_sandbox_processes: int
    sandbox_cpu_by_program: dict[str, float]

    @property
    def sessions_per_s(self) -> float:
        return self.n / self.wall_s


def _env(name: str, ports: Mapping[str, int], n: int, args: argparse.Namespace) -> dict[str, str]:
    # The bench is the operator: the example task's repository lies under its directory.
    roots = json.dumps([str(TASK_FILE.parent)])
    if name == "evaluator":
        return {"POLAR_EVALUATOR_TASK_ROOTS": roots, "POLAR_EVALUATOR_MIN_ISOLATION": args.isolation}
    if name == "proxy":
        return {
            "POLAR_PROXY_BACKEND": "scripted",
            "POLAR_PROXY_BACKEND_OPTIONS": json.dumps({"turns": script(args.calls)}),
            "POLAR_PROXY_MODEL": "tiny",
            "POLAR_PROXY_HTTP_HOST": "127.0.0.1",
            "POLAR_PROXY_HTTP_PORT": str(ports["proxy_http"]),
            "POLAR_PROXY_CONTEXT_LENGTH": "65536",
            "POLAR_PROXY_FSYNC": "false",
        }
    if name == "gateway":
        env = {
            "POLAR_GATEWAY_PROXY_ADDRESS": f"127.0.0.1:{ports['proxy']}",
            "POLAR_GATEWAY_RECONSTRUCTOR_ADDRESS": f"127.0.0.1:{ports['reconstructor']}",
            "POLAR_GATEWAY_EVALUATOR_ADDRESS": f"127.0.0.1:{ports['evaluator']}",
            "POLAR_GATEWAY_HARNESS_BIN_DIR": str(BIN_DIR),
            "POLAR_GATEWAY_MAX_SESSIONS": str(n),
            "POLAR_GATEWAY_RUNNING_WORKERS": str(n),
            "POLAR_GATEWAY_POSTRUN_BACKLOG_LIMIT": str(n),
            "POLAR_GATEWAY_METRICS_PORT": "-1",
            "POLAR_GATEWAY_TASK_ROOTS": roots,
            "POLAR_GATEWAY_MIN_ISOLATION": args.isolation,
        }
        for key in ("init_workers", "ready_capacity", "postrun_workers"):
            if getattr(args, key) is not None:
                env[f"POLAR_GATEWAY_{key.upper()}"] = str(getattr(args, key))
        return env
    return {}


def _spec(task: Any, index: int, args: argparse.Namespace) -> session_pb2.SessionSpec:
    return session_pb2.SessionSpec(session_id=f"hc-{index:04d}", task_id=task.task_id, sample_index=index,
                                   task=task, attempt=1)  # fmt: skip


async def _watch_done(stub: Any, task_id: str, n: int, done: dict[str, float]) -> None:
    stream = stub.WatchSessions(pb.WatchSessionsRequest(task_id=task_id, include_current=True))
    async for event in stream:
        if event.state.stage == status_pb2.SESSION_STAGE_DONE:
            done.setdefault(event.state.session_id, time.monotonic())
            if len(done) >= n:
                stream.cancel()
                return


async def _until_available(stub: Any, n: int, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while (await stub.GetCapacity(pb.GetCapacityRequest())).available < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway did not offer {n} sessions within {limit_s:.0f} s")
        await asyncio.sleep(0.2)


async def run_one(n: int, root: Path, args: argparse.Namespace) -> Result:
    """Start the four services, run ``n`` sessions at once, measure, check for leaks, stop the services."""
    await asyncio.to_thread(root.mkdir, parents=True)
    procs = ServiceProcesses(root)
    ports = {name: free_port() for name in (*SERVICES, "proxy_http")}
    accounts = {name: CpuAccount.create(f"{root.parent.name}-{root.name}-{name}") for name in SERVICES}
    try:
        for name in SERVICES:
            procs.serve(name, name, "127.0.0.1", ports[name], _env(name, ports, n, args))
            accounts[name].add(procs.services[name].process.pid)
        await procs.wait_healthy(list(SERVICES), limit_s=180)
        pids = {name: procs.services[name].process.pid for name in SERVICES}
        cpu0 = {name: _stat(pid) for name, pid in pids.items()}
        tree0 = {name: accounts[name].seconds() for name in SERVICES}
        busy0 = _host_busy()
        task = load_task(TASK_FILE)
        task.harness.options.update({"provider_mode": "openai-completions"})
        task.timeout_seconds = args.timeout
        task.num_samples = n
        sampler = Sampler(root, pids)
        sampling = asyncio.create_task(sampler.run())
        channel = open_channel(f"127.0.0.1:{ports['gateway']}")
        try:
            stub = pb_grpc.GatewayServiceStub(channel)
            done: dict[str, float] = {}
            watcher = asyncio.create_task(_watch_done(stub, task.task_id, n, done))
            await _until_available(stub, n)  # the gateway's probes have seen its dependencies up
            started = time.monotonic()
            await asyncio.gather(*(stub.StartSession(pb.StartSessionRequest(spec=_spec(task, i, args)))
                                   for i in range(n)))  # fmt: skip
            await asyncio.wait_for(watcher, timeout=args.timeout + 600)
            wall = max(done.values()) - started
            results = [(await stub.GetSession(pb.GetSessionRequest(session_id=f"hc-{i:04d}"))).result for i in range(n)]
        finally:
            sampling.cancel()
            await channel.close(None)
        cpu1 = {name: _stat(pid) for name, pid in pids.items()}
        tree1 = {name: accounts[name].seconds() for name in SERVICES}
        busy1 = _host_busy()
        rss = {name: _status_kb(pid, "VmHWM") / 1024 for name, pid in pids.items()}
        await asyncio.sleep(1.0)  # teardown of the last session is done before its result is reported
        leaked = leftover_processes(root, set(pids.values()))
        sandboxes = leftover_sandboxes(root)
    finally:
        procs.kill_all()
        for account in accounts.values():
            account.remove()
    statuses: dict[str, int] = {}
    timings: dict[str, list[float]] = {k: [] for k in ("init", "ready", "running", "postrun", "total")}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
        for k in timings:
            timings[k].append(r.timings.get(k, 0.0))
    own = {name: cpu1[name][0] - cpu0[name][0] for name in SERVICES}

    def descendants(name: str, owner: str) -> float:
        before, after = tree0[name], tree1[name]
        if before is None or after is None:
            return sampler.cpu(owner)  # a lower bound: what /proc showed while they lived
        return after - before - own[name]

    cpu = {
        "gateway": own["gateway"],
        "agent sandboxes": descendants("gateway", "gateway"),
        "proxy": own["proxy"],
        "evaluator": own["evaluator"],
        "eval sandboxes": descendants("evaluator", "evaluator"),
        "reconstructor": cpu1["reconstructor"][0] - cpu0["reconstructor"][0],
    }
    return Result(
        n=n,
        wall_s=wall,
        statuses=statuses,
        timings=timings,
        cpu=cpu,
        peak_rss_mb=rss,
        peak_fds=dict(sampler.peak_fds),
        host_busy=(busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1e-9),
        host_cpu_s=busy1[0] - busy0[0],
        leaked_processes=leaked,
        leaked_sandboxes=sandboxes,
        calls=[r.statistics.completions for r in results],
        peak_sandbox_processes=sampler.peak_sandbox_processes[0],
        sandbox_cpu_by_program=sampler.by_program(),
    )


# ----------------------------------------------------------------------------------------- the table


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def rows(r: Result) -> list[tuple[str, float, str]]:
    """(name, value, format) of one run."""
    out: list[tuple[str, float, str]] = [("sessions/s", r.sessions_per_s, ".3f"), ("wall s", r.wall_s, ".1f")]
    for key, label in (("init", "INIT"), ("ready", "READY"), ("running", "RUN"), ("postrun", "POSTRUN"),
                       ("total", "total")):  # fmt: skip
        out.append((f"{label} p50 s", _pct(r.timings[key], 0.5), ".2f"))
        out.append((f"{label} p99 s", _pct(r.timings[key], 0.99), ".2f"))
    for name in ("gateway", "agent sandboxes", "proxy", "evaluator", "eval sandboxes", "reconstructor"):
        out.append((f"{name} CPU-s/session", r.cpu[name] / r.n, ".3f"))
    out.append(("all CPU-s/session", sum(r.cpu.values()) / r.n, ".3f"))
    out.append(("host CPU-s/session", r.host_cpu_s / r.n, ".3f"))
    for name in SERVICES:
        out.append((f"{name} peak RSS MB", r.peak_rss_mb[name], ".0f"))
    for name in SERVICES:
        out.append((f"{name} peak fds", r.peak_fds.get(name, 0), ".0f"))
    out.append(("peak sandbox processes", r.peak_sandbox_processes, ".0f"))
    out.append(("host CPU busy %", 100 * r.host_busy, ".0f"))
    out.append(("leaked processes", len(r.leaked_processes), ".0f"))
    out.append(("leaked sandboxes", len(r.leaked_sandboxes), ".0f"))
    return out


def print_markdown(results: Sequence[Result]) -> None:
    """The table as Markdown (for docs/gateway.md)."""
    base = rows(results[0])
    print("| | " + " | ".join(f"N={r.n} | ratio" for r in results) + " |")
    print("|---|" + "---:|---:|" * len(results))
    for i, (name, _, _) in enumerate(base):
        cells = []
        for r in results:
            _, value, fmt = rows(r)[i]
            ref = base[i][1]
            cells += [format(value, fmt), f"{value / ref:.2f}" if ref else "-"]
        print(f"| {name} | " + " | ".join(cells) + " |")


def print_table(results: Sequence[Result]) -> None:
    """One column per N, each with its ratio against the first N."""
    base = rows(results[0])
    header = f"{'':28}" + "".join(f"{'N=' + str(r.n):>10}{'ratio':>7}" for r in results)
    print(header)
    for i, (name, _, _) in enumerate(base):
        line = f"{name:28}"
        for r in results:
            _, value, fmt = rows(r)[i]
            ref = base[i][1]
            ratio = f"{value / ref:.2f}" if ref else "-"
            line += f"{format(value, fmt):>10}{ratio:>7}"
        print(line)
    for r in results:
        calls = statistics.mean(r.calls) if r.calls else 0
        print(f"N={r.n}: statuses {r.statuses}, mean calls {calls:.1f}")
        top = ", ".join(f"{k} {v / r.n:.3f}" for k, v in list(r.sandbox_cpu_by_program.items())[:8])
        print(f"  sampled sandbox CPU-s/session by program (a lower bound): {top}")
        for leak in [*r.leaked_processes, *r.leaked_sandboxes]:
            print(f"  LEAK {leak}")


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.host_capacity", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[8, 32, 64], help="concurrent sessions per run")
    parser.add_argument("--calls", type=int, default=10, help="model calls per session (tool loop)")
    parser.add_argument("--timeout", type=float, default=900.0, help="agent budget per session (s)")
    parser.add_argument("--init-workers", type=int, default=None)
    parser.add_argument("--ready-capacity", type=int, default=None)
    parser.add_argument("--postrun-workers", type=int, default=None)
    parser.add_argument("--isolation", choices=["bwrap", "gvisor"], default="bwrap",
                        help="the sandboxes' isolation (per-session and per-command costs of each: the Markdown "
                        "table of `python -m bench.host_capacity.sandbox_cost`)")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the run directory (service logs)")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers to this file")
    parser.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    args = parser.parse_args(argv)
    if not clis_installed():
        print("the harness CLIs are not installed (scripts/setup_harnesses.sh) or bwrap is missing", file=sys.stderr)
        return 2
    print(f"host: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; {args.calls}-call pi tool loops; "
          f"isolation {args.isolation}", flush=True)  # fmt: skip
    results = []
    with contextlib.ExitStack() as stack:
        base = Path(tempfile.mkdtemp(prefix="polar-hc-"))
        if not args.keep:
            stack.callback(lambda: __import__("shutil").rmtree(base, ignore_errors=True))
        for n in args.n:
            r = await run_one(n, base / f"n{n}", args)
            print(f"N={n}: {r.sessions_per_s:.3f} sessions/s, {r.wall_s:.1f} s, {r.statuses}", flush=True)
            results.append(r)
        if args.keep:
            print(f"run directory: {base}")
    print_table(results)
    if args.markdown:
        print_markdown(results)
    if args.json is not None:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    leaks = sum(len(r.leaked_processes) + len(r.leaked_sandboxes) for r in results)
    return 1 if leaks else 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
