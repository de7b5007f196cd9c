"""Measure the model proxy's added latency and peak throughput, side by side with LiteLLM's proxy.

Run: ``.venv/bin/python -m bench.proxy_overhead`` (``--quick`` for a short run; ``--json PATH`` saves the
numbers). LiteLLM's column needs ``scripts/setup_litellm.sh`` (it is left out, with the reason, otherwise).

Every server runs in a process of its own with one event loop (one worker); the clients are raw asyncio
HTTP/1.1 keep-alive connections (:mod:`bench.proxy_overhead.load`), so no HTTP library's cost hides in the
numbers. Targets:

* **direct** -- the stub backend itself (:mod:`bench.proxy_overhead.stub`: canned answers, no parsing).
* **proxy** -- the full pipeline (auth, translation, normalisation, incremental rendering and tokenisation,
  backend call, parsing, the completion record fsync'd before the answer) with an in-process backend that
  answers at once: the proxy's own cost. Also with ``fsync`` off, with the ``vllm`` backend calling the
  stub over HTTP (token IDs in and out), i.e. the same extra hop that LiteLLM pays, and with the ``triton``
  backend calling a PyTriton server that answers scripted IDs at once (tensors over gRPC; needs
  ``.venv-triton``, else left out with the reason).
* **triton direct** -- that PyTriton server called directly (:mod:`bench.proxy_overhead.triton_direct`:
  pre-serialised requests with a prompt of the proxy's length), the baseline of the proxy's Triton row.
* **LiteLLM** -- ``litellm --config`` (``litellm[proxy]``, one worker) with the stub as its ``openai/``
  upstream.

Calls: a small Chat Completions call, and a Claude-Code-sized Anthropic Messages call (25 tools and a
32k-token history). Latency: requests one at a time; the Claude-Code-sized call grows by one assistant turn
and one user turn each time (every target sees the same sequence; the proxy's session cache sees an agent
loop). Added latency = target percentile - direct percentile of the same run (for the Triton row: - triton direct).
The backend-hop table puts the in-process, vLLM and Triton rows side by side, with the ratio of each one's added
p50 to the in-process row's. Peak throughput: closed-loop
load from several client processes against the one worker; each connection is its own session (as agents
are), and for the big call each connection repeats one 32k-token request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.proxy_overhead.load import build_request, connect, latencies, peak_rps, settle, timed
from bench.proxy_overhead.servers import (
    TRITON_MODEL,
    Child,
    LiteLLM,
    canned_ids,
    start_child,
    start_litellm,
    start_triton,
)
from bench.proxy_overhead.stub import CANNED
from bench.proxy_overhead.triton_direct import TritonDirect
from polar_core.model_fixtures import build_tiny_tokenizer

Body = dict[str, Any]
VLLM_ROW = "proxy -> vllm backend -> stub"
TRITON_ROW = "proxy -> triton backend -> pytriton"
HOP_LABELS = {"proxy": "in-process", VLLM_ROW: "vllm -> stub (HTTP)", TRITON_ROW: "triton -> PyTriton (gRPC)"}


@dataclasses.dataclass
class Target:
    """One server under test and how to address it."""

    name: str
    port: int
    auth: Callable[[int, bool], dict[str, str]]
    """Headers for connection ``i``; the flag says Anthropic Messages (else Chat Completions)."""
    pid: int = 0
    """The server's process (0: not measured), for CPU seconds per request."""
    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    baseline: str = "direct"
    """The target whose percentiles this one's added latency is counted from."""
    grpc: TritonDirect | None = None
    """Set for the direct Triton target: measured with raw gRPC calls, not HTTP (no load runs)."""

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far (Linux ``/proc``; 0 when unknown)."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def small(self, i: int, body: bytes) -> bytes:
        return build_request(self.port, "/v1/chat/completions", body, self.auth(i, False))

    def big(self, i: int, body: bytes) -> bytes:
        headers = {"anthropic-version": "2023-06-01", **self.auth(i, True)}
        return build_request(self.port, "/v1/messages", body, headers)


def big_conversation(n_tools: int, target_tokens: int, tok: Any) -> tuple[list[Body], list[Body]]:
    """Tools and a history like a Claude Code session's: text + tool_use turns and 40-line tool results."""
    tools = [
        {
            "name": f"tool_{i}",
            "description": f"Tool number {i}: does something useful with files and commands. " * 4,
            "input_schema": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "A path."}, "n": {"type": "integer"}},
                "required": ["path"],
            },
        }
        for i in range(n_tools)
    ]
    messages: list[Body] = [{"role": "user", "content": "Fix the failing test in the repository."}]
    i = 0
    while len(tok.backend_tokenizer.encode(json.dumps(messages)).ids) < target_tokens:
        use = {"type": "tool_use", "id": f"tu{i}", "name": f"tool_{i % n_tools}", "input": {"path": f"src/m{i}.py"}}
        text = {"type": "text", "text": f"Step {i}: let me look at the next file."}
        messages.append({"role": "assistant", "content": [text, use]})
        result = "\n".join(f"line {j}: value = compute({i}, {j})  # comment about step {i}" for j in range(40))
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"tu{i}", "content": result}]}
        )
        i += 1
    return tools, messages


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _encode(body: Body) -> bytes:
    return json.dumps(body).encode()


async def _latency_runs(targets: list[Target], args: argparse.Namespace, tok: Any) -> int:
    small = _encode({"model": "policy", "messages": [{"role": "user", "content": "What is 6 times 7?"}]})
    big_session = args.connections  # a session of its own, not used by the load runs
    proxy = next(t for t in targets if t.name == "proxy")
    conn = await connect(proxy.port)
    status, answer = await conn.send(proxy.small(0, small))
    assert status == 200
    assert conn.transport is not None
    conn.transport.close()
    small_ids: int = json.loads(answer)["usage"]["prompt_tokens"]  # the prompt the backends see
    for t in targets:
        if t.grpc is not None:
            await t.grpc.latencies(small_ids, args.warmup)
        else:
            await latencies(t.port, [t.small(0, small)] * args.warmup)
        t.results["small_ms"] = []
    # Interleaved blocks, so drift (other load, CPU frequency) affects every target alike; before each block or
    # call, every server is let go idle, so no server's after-work lands on the next one's measurement.
    pids = [t.pid for t in targets]
    block = max(1, args.requests // 10)
    for _ in range(max(1, args.requests // block)):
        for t in targets:
            await settle(pids)
            if t.grpc is not None:
                t.results["small_ms"] += await t.grpc.latencies(small_ids, block)
            else:
                t.results["small_ms"] += await latencies(t.port, [t.small(0, small)] * block)

    tools, history = big_conversation(25, args.big_tokens, tok)
    base: Body = {"model": "policy", "max_tokens": 64, "system": "You are a coding agent.", "tools": tools}
    conns = {t.name: await connect(t.port) for t in targets if t.grpc is None}
    big_ids = 0
    for t in targets:
        await settle(pids)
        if t.grpc is not None:  # after the proxy's cold call: a prompt of the proxy's length
            t.results["big_cold_ms"] = await t.grpc.timed(big_ids)
        elif t is proxy:
            start = asyncio.get_running_loop().time()
            status, answer = await conns[t.name].send(t.big(big_session, _encode({**base, "messages": history})))
            t.results["big_cold_ms"] = (asyncio.get_running_loop().time() - start) * 1000
            assert status == 200, answer[:300]
            big_ids = json.loads(answer)["usage"]["input_tokens"]
        else:
            t.results["big_cold_ms"] = await timed(
                conns[t.name], t.big(big_session, _encode({**base, "messages": history}))
            )
        t.results["big_ms"] = []
        t.results["big_after_cpu_ms"] = []
    for k in range(args.big_turns):
        history = [*history, {"role": "assistant", "content": CANNED}, {"role": "user", "content": f"next {k}"}]
        body = _encode({**base, "messages": history})
        for t in targets:
            await settle(pids)
            if t.grpc is not None:
                t.results["big_ms"].append(await t.grpc.timed(big_ids))
                continue
            if conns[t.name].closed:  # idle past the server's keep-alive while a slow target answered
                conns[t.name] = await connect(t.port)
            t.results["big_ms"].append(await timed(conns[t.name], t.big(big_session, body)))
            # What the servers still did after this answer (LiteLLM's callbacks, a proxy's deferred metrics).
            t.results["big_after_cpu_ms"].append(await settle(pids))
    # The prompt size, as the proxy reports it.
    if conns["proxy"].closed:
        conns["proxy"] = await connect(proxy.port)
    status, answer = await conns["proxy"].send(targets[1].big(big_session, body))
    assert status == 200
    assert targets[1].name == "proxy"
    for conn in conns.values():
        assert conn.transport is not None
        conn.transport.close()
    for t in targets:
        if t.grpc is not None:
            await t.grpc.close()
    prompt_tokens: int = json.loads(answer)["usage"]["input_tokens"]
    return prompt_tokens


def _throughput_runs(targets: list[Target], args: argparse.Namespace, tok: Any) -> None:
    small = _encode({"model": "policy", "messages": [{"role": "user", "content": "What is 6 times 7?"}]})
    tools, history = big_conversation(25, args.big_tokens, tok)
    big = _encode(
        {"model": "policy", "max_tokens": 64, "system": "You are a coding agent.", "tools": tools, "messages": history}
    )
    for t in targets:
        if t.grpc is not None:
            continue
        for kind, make, body in (("small", t.small, small), ("big", t.big, big)):
            requests = [make(i, body) for i in range(args.connections)]
            asyncio.run(latencies(t.port, requests))  # one call per session first: prime the session caches
            cpu = t.cpu_seconds()
            rps, errors = peak_rps(t.port, requests, seconds=args.seconds, processes=args.processes)
            t.results[f"{kind}_rps"] = rps
            if t.pid and rps:
                # Server CPU per request: the worker's ceiling is 1 / this, whatever else shares the cores.
                t.results[f"{kind}_cpu_ms"] = (t.cpu_seconds() - cpu) / (rps * args.seconds) * 1000
            if errors:
                t.results[f"{kind}_errors"] = errors


def _proxy_target(name: str, child: Child) -> Target:
    tokens: list[str] = child.info["tokens"]

    def auth(i: int, anthropic: bool) -> dict[str, str]:
        token = tokens[i % len(tokens)]
        return {"x-api-key": token} if anthropic else {"authorization": f"Bearer {token}"}

    return Target(name, child.info["port"], auth, pid=child.proc.pid)


def _report(
    targets: list[Target], args: argparse.Namespace, prompt_tokens: int, litellm_note: str, triton_note: str
) -> str:
    by = {t.name: t.results for t in targets}
    d = by["direct"]
    lines = [
        f"one worker per server; {os.cpu_count()} CPU cores shared by servers and {args.processes} client processes; "
        f"{args.connections} connections for peak req/s; Claude-Code-sized call: 25 tools, {prompt_tokens} prompt "
        "tokens at the last turn (tiny Qwen2-style tokenizer)",
        "",
    ]

    def stats(t: Target, kind: str) -> tuple[float, float, float, float]:
        r, base = t.results, by[t.baseline]
        p50, p99 = _pct(r[f"{kind}_ms"], 0.5), _pct(r[f"{kind}_ms"], 0.99)
        return p50, p99, p50 - _pct(base[f"{kind}_ms"], 0.5), p99 - _pct(base[f"{kind}_ms"], 0.99)

    # The table: one row per call size; proxy = full pipeline, in-process backend, fsync on.
    named = {t.name: t for t in targets}
    proxy, lite = by["proxy"], by.get("LiteLLM")
    head = (
        "| call | direct p50 / p99 ms | proxy added p50 / p99 ms | LiteLLM added p50 / p99 ms "
        "| peak req/s direct / proxy / LiteLLM | proxy vs LiteLLM (added p50, req/s) |"
    )
    lines += [head, "|" + "---|" * 6]
    for kind, label in (("small", "small chat call"), ("big", "Claude-Code-sized turn")):
        dp50, dp99 = _pct(d[f"{kind}_ms"], 0.5), _pct(d[f"{kind}_ms"], 0.99)
        _, _, pa50, pa99 = stats(named["proxy"], kind)
        if lite is not None:
            _, _, la50, la99 = stats(named["LiteLLM"], kind)
            lite_cell = f"{la50:.2f} / {la99:.2f}"
            lite_rps = f"{lite[f'{kind}_rps']:.0f}"
            rps_ratio = proxy[f"{kind}_rps"] / lite[f"{kind}_rps"] if lite[f"{kind}_rps"] else float("inf")
            ratio = f"{la50 / pa50:.0f}x less added, {rps_ratio:.0f}x req/s"
        else:
            lite_cell, lite_rps, ratio = "n/a", "n/a", "n/a"
        lines.append(
            f"| {label} | {dp50:.3f} / {dp99:.3f} | {pa50:.2f} / {pa99:.2f} | {lite_cell} | "
            f"{d[f'{kind}_rps']:.0f} / {proxy[f'{kind}_rps']:.0f} / {lite_rps} | {ratio} |"
        )

    # The backend hop: the proxy with each backend, added p50 against the in-process row (target: <= 1.5x).
    hops = [t for t in targets if t.name in ("proxy", VLLM_ROW, TRITON_ROW)]
    lines += ["", "Backend hop (added p50 ms, its ratio to the in-process backend's, server CPU ms/req):", ""]
    lines.append("| backend | small added p50 | ratio | CPU ms/req | 35k added p50 | ratio | CPU ms/req |")
    lines.append("|" + "---|" * 7)
    for t in hops:
        cells = []
        for kind in ("small", "big"):
            added = stats(t, kind)[2]
            cpu = t.results.get(f"{kind}_cpu_ms")
            cells += [f"{added:.2f}", f"{added / stats(named['proxy'], kind)[2]:.2f}x", f"{cpu:.2f}" if cpu else "-"]
        lines.append(f"| {HOP_LABELS[t.name]} | " + " | ".join(cells) + " |")

    lines += ["", *_target_ratios(named, stats)]

    lines += ["", "All targets (ms; added = over direct, or triton direct, at the same percentile):", ""]
    lines.append(
        "| target | small p50 / p99 | added p50 / p99 | req/s | server CPU ms/req | big p50 / p99 | added p50 / p99 "
        "| req/s | server CPU ms/req | big cold | CPU after a big answer p50 |"
    )
    lines.append("|" + "---|" * 11)
    for t in targets:
        r = t.results
        s50, s99, sa50, sa99 = stats(t, "small")
        b50, b99, ba50, ba99 = stats(t, "big")
        scpu = f"{r['small_cpu_ms']:.2f}" if "small_cpu_ms" in r else "-"
        bcpu = f"{r['big_cpu_ms']:.2f}" if "big_cpu_ms" in r else "-"
        srps = f"{r['small_rps']:.0f}" if "small_rps" in r else "-"
        brps = f"{r['big_rps']:.0f}" if "big_rps" in r else "-"
        lines.append(
            f"| {t.name} | {s50:.3f} / {s99:.3f} | {sa50:.2f} / {sa99:.2f} | {srps} | {scpu} | "
            f"{b50:.2f} / {b99:.2f} | {ba50:.2f} / {ba99:.2f} | {brps} | {bcpu} | {r['big_cold_ms']:.1f} | "
            f"{_pct(r['big_after_cpu_ms'], 0.5):.2f} |"
        )
    lines.append(
        "\nBefore each call the bench waits until every server is idle (< 5% of a core over 5 ms); the last column "
        "is the CPU the servers used after the answer, which would otherwise land on the next target's call."
    )
    errors = {t.name: {k: v for k, v in t.results.items() if k.endswith("_errors")} for t in targets}
    errors = {k: v for k, v in errors.items() if v}
    if errors:
        lines.append(f"\nnon-200 answers during load: {errors}")
    if litellm_note:
        lines.append(f"\nLiteLLM: not run: {litellm_note}")
    if triton_note:
        lines.append(f"\nTriton: not run: {triton_note}")
    return "\n".join(lines)


def _target_ratios(named: dict[str, Target], stats: Callable[[Target, str], tuple[float, ...]]) -> list[str]:
    """Issue 20's two ratios of added p50s in this run: proxy / LiteLLM (big call <= 1/6) and vLLM hop /
    in-process (small call <= 1.5x)."""
    lines = [
        "Targets (ratios of added p50 in this run):",
        "",
        "| ratio | small call | 35k-token call | target |",
        "|---|---|---|---|",
    ]
    proxy = named["proxy"]
    pairs = (
        ("proxy / LiteLLM", named.get("LiteLLM"), "35k-token call <= 1/6 (0.167)"),
        ("vllm hop / in-process", named.get(VLLM_ROW), "small call <= 1.5"),
    )
    for label, other, target in pairs:
        if other is None:
            lines.append(f"| {label} | n/a | n/a | {target} |")
            continue
        cells = []
        for kind in ("small", "big"):
            num, den = (proxy, other) if other.name == "LiteLLM" else (other, proxy)
            a, b = stats(num, kind)[2], stats(den, kind)[2]
            cells.append(f"{a / b:.3f}" if b > 0 else "n/a")
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {target} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description="proxy overhead vs a direct call and vs LiteLLM")
    parser.add_argument("--quick", action="store_true", help="short run (fewer requests, 1.5 s load runs)")
    parser.add_argument("--requests", type=int, default=2000, help="small calls per target for latency")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--big-tokens", type=int, default=32000)
    parser.add_argument("--big-turns", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each peak-throughput run")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--processes", type=int, default=2, help="load-generating client processes")
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--no-triton", action="store_true", help="leave out the Triton hop (PyTriton)")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.warmup, args.big_turns, args.seconds = 400, 100, 10, 1.5

    tok = build_tiny_tokenizer()
    children: list[Child] = []
    litellm: LiteLLM | None = None
    workdir = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    with contextlib.ExitStack() as stack:
        triton_url, triton_note = None, "--no-triton"
        if not args.no_triton:
            triton_url, triton_note = stack.enter_context(start_triton(canned_ids(tok), workdir))
        try:
            stub = start_child("bench.proxy_overhead.stub", json.dumps(canned_ids(tok)))
            children.append(stub)
            sessions = str(args.connections + 1)
            proxies = {
                "proxy": ["proxy"],
                "proxy, fsync off": ["proxy", "--no-fsync"],
                VLLM_ROW: ["proxy", "--stub-port", str(stub.info["port"])],
            }
            if triton_url is not None:
                proxies[TRITON_ROW] = ["proxy", "--triton-url", triton_url]
            targets = [
                Target("direct", stub.info["port"], lambda i, a: {"x-api-key": "stub"} if a else {}, pid=stub.proc.pid)
            ]
            for name, argv in proxies.items():
                child = start_child("bench.proxy_overhead.servers", *argv, "--sessions", sessions)
                children.append(child)
                targets.append(_proxy_target(name, child))
            if triton_url is not None:
                targets[-1].baseline = "triton direct"
                direct = TritonDirect(triton_url, TRITON_MODEL, canned_ids(tok)[-1])
                targets.append(Target("triton direct", 0, lambda i, a: {}, grpc=direct))
            note = "--no-litellm"
            if not args.no_litellm:
                litellm, note = start_litellm(stub.info["port"], workdir)
            if litellm is not None:
                key = litellm.key
                bearer: dict[str, str] = {"authorization": f"Bearer {key}"}
                targets.append(Target("LiteLLM", litellm.port, lambda i, a: bearer, pid=litellm.proc.pid))
            prompt_tokens = asyncio.run(_latency_runs(targets, args, tok))
            _throughput_runs(targets, args, tok)
        finally:
            if litellm is not None:
                litellm.stop()
            for child in children:
                child.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json is not None:  # first: the raw numbers survive a report that fails
        args.json.write_text(json.dumps({t.name: t.results for t in targets}))
    print(_report(targets, args, prompt_tokens, note, triton_note))


if __name__ == "__main__":
    main()
