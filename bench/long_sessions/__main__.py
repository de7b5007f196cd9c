"""Benchmark long sessions: resident memory of the embedded stack after every ``--step`` long sessions.

Runs ``--sessions`` sessions (default 200, in tasks of ``--step`` samples, one task at a time) of the
command-harness agent of :mod:`integration_tests.support.long_sessions` through the embedded stack (real
rollout server, gateway, model proxy with the scripted backend and the tiny tokenizer, reconstructor and
evaluator, all over gRPC in this one process). Each session makes ``--calls`` calls whose context grows by
``--tool-bytes`` tokens per call (default 20 calls x 2.5 kB: the last prompt is ~50k tokens, the session's
completions ~1.1 M prompt tokens). After every task the table gets one row: the process's resident memory
(VmRSS, the sum of the five services: they share the process; the agents are separate processes, not
counted) and what each service still holds of finished sessions: completion records the proxy keeps in memory,
completion records and traces the gateway keeps. Memory must stay bounded by what is in flight (``--step``
sessions, ``running_workers`` at once), not grow with what was recorded: the ratio column is against the first
row of the same run.

With ``--processes`` the five services run as separate ``polar serve`` processes instead
(:mod:`bench.long_sessions.processes`) and each row gives every service's own VmRSS, with its ratio against
the first row.

Run: ``.venv/bin/python -m bench.long_sessions [--processes] [--sessions 200] [--step 50] [--calls 20]
[--tool-bytes 2500]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
from pathlib import Path

from bench.long_sessions.processes import SERVICES, process_stack
from integration_tests.support.long_sessions import long_task, stack_options
from polar_client import RolloutClient
from polar_run.embedded import EmbeddedStack


def rss_mib() -> float:
    """This process's resident set size in MiB (``VmRSS`` of ``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def held() -> tuple[int, int, int]:
    """Completion records held by proxy sessions, and completion records and traces held by gateway sessions."""
    from gateway.session import Session as GatewaySession
    from model_proxy.core.sessions import Session as ProxySession

    proxy = gateway_records = gateway_traces = 0
    for obj in gc.get_objects():
        if isinstance(obj, ProxySession):
            proxy += len(obj.records)
        elif isinstance(obj, GatewaySession):
            gateway_records += len(obj.completions)
            gateway_traces += len(obj.result.traces) if obj.result is not None else 0
    return proxy, gateway_records, gateway_traces


async def run(args: argparse.Namespace) -> None:
    """Run the sessions and print the table."""
    with tempfile.TemporaryDirectory(prefix="bench-long-") as tmp:
        root = Path(tmp)
        options = stack_options(
            root / "state", root / "script.jsonl", calls=args.calls, tool_bytes=args.tool_bytes, workers=args.workers
        )
        rows: list[tuple[int, float, float, tuple[int, int, int]]] = []
        started = time.perf_counter()
        async with (
            EmbeddedStack.start(options) as stack,
            RolloutClient(stack.rollout_address, token=stack.token, timeout_s=120) as client,
        ):
            print(f"stack up in {time.perf_counter() - started:.0f} s; baseline RSS {rss_mib():.0f} MiB", flush=True)
            done = 0
            while done < args.sessions:
                samples = min(args.step, args.sessions - done)
                task = long_task(f"long-{done}", calls=args.calls, tool_bytes=args.tool_bytes, samples=samples)
                reply = await client.submit(task)
                await client.wait(reply.task_id, poll_s=0.5)
                summary = await client.get(reply.task_id, omit_traces=True)
                bad = [r.status for r in summary.session_results if r.status != "resolved"]
                if bad:
                    raise SystemExit(f"sessions did not resolve: {bad}")
                done += samples
                gc.collect()
                rows.append((done, time.perf_counter() - started, rss_mib(), held()))
                print(f"  {done} sessions done, RSS {rows[-1][2]:.0f} MiB", flush=True)
        first = rows[0][2]
        print(f"\n{args.calls} calls x {args.tool_bytes} B tool output per session, {args.workers} running at once")
        print(
            "| sessions | elapsed s | RSS MiB (all services) | ratio | proxy records held | gateway records held "
            "| gateway traces held |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for count, elapsed, rss, (proxy, records, traces) in rows:
            print(f"| {count} | {elapsed:.0f} | {rss:.0f} | {rss / first:.2f} | {proxy} | {records} | {traces} |")


async def _run_task(client: RolloutClient, task_id: str, args: argparse.Namespace, samples: int) -> None:
    """Submit one task of ``samples`` long sessions, wait for it, and fail unless every session resolved."""
    reply = await client.submit(long_task(task_id, calls=args.calls, tool_bytes=args.tool_bytes, samples=samples))
    await client.wait(reply.task_id, poll_s=0.5)
    summary = await client.get(reply.task_id, omit_traces=True)
    bad = [(r.status, r.error_message[:200]) for r in summary.session_results if r.status != "resolved"]
    if bad or len(summary.session_results) != samples:
        raise SystemExit(f"sessions did not resolve: {bad}")


async def run_processes(args: argparse.Namespace) -> None:
    """Run the sessions against the services as separate processes and print each one's resident memory."""
    with tempfile.TemporaryDirectory(prefix="bench-long-") as tmp:
        root = Path(tmp)
        script = root / "script.jsonl"
        stack_options(root / "unused", script, calls=args.calls, tool_bytes=args.tool_bytes)  # writes the script
        context = 1024 + args.calls * (args.tool_bytes + 256)
        rows: list[tuple[int, float, dict[str, float]]] = []
        started = time.perf_counter()
        async with (
            process_stack(root / "services", script, context_length=context, workers=args.workers) as stack,
            RolloutClient(stack.rollout_address, token=stack.token, timeout_s=120) as client,
        ):
            base = stack.rss()
            print(f"services up in {time.perf_counter() - started:.0f} s; RSS MiB {base}", flush=True)
            rows.append((0, time.perf_counter() - started, base))
            done = 0
            while done < args.sessions:
                samples = min(args.step, args.sessions - done)
                await _run_task(client, f"long-{done}", args, samples)
                done += samples
                rows.append((done, time.perf_counter() - started, stack.rss()))
                print(f"  {done} sessions done, RSS MiB {rows[-1][2]}", flush=True)
        first = rows[1][2]
        print(
            f"\n{args.calls} calls x {args.tool_bytes} B tool output per session, {args.workers} running at once;"
            " VmRSS MiB of each service process (ratio against the first measured row, after the first step)"
        )
        print("| sessions | elapsed s | " + " | ".join(SERVICES) + " |")
        print("|---:|---:|" + "---:|" * len(SERVICES))
        for count, elapsed, rss in rows:
            cells = [f"{rss[n]:.0f} ({rss[n] / first[n]:.2f})" if count else f"{rss[n]:.0f}" for n in SERVICES]
            print(f"| {count} | {elapsed:.0f} | " + " | ".join(cells) + " |")


def main() -> None:
    """Parse flags and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--step", type=int, default=50)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--tool-bytes", type=int, default=2500)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--processes", action="store_true", help="run each service as its own process")
    args = parser.parse_args()
    asyncio.run(run_processes(args) if args.processes else run(args))


if __name__ == "__main__":
    main()
