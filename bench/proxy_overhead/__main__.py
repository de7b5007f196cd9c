"""Measure the model proxy's added latency and peak throughput (run: ``python -m bench.proxy_overhead``).

Both servers run in a child process (one event loop, one uvicorn worker each); the client (httpx) runs in
this process. The baseline ("direct") is a minimal Starlette server that parses the JSON body and
returns a canned Chat Completions answer, i.e. the cost any HTTP hop pays; the proxy does the full pipeline
(auth, translation, normalisation, rendering, tokenisation, backend call to an instant stub, parsing,
durable fsync'd record). Added latency = proxy percentile - direct percentile, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from model_proxy.app import ProxyApp
from model_proxy.core.types import GenerationChunk, GenerationRequest
from model_proxy.settings import ProxySettings
from polar_core.model_fixtures import build_tiny_tokenizer

CANNED = "The answer is 42."


class StubBackend:
    """Answers instantly with fixed IDs."""

    name = "stub"

    def __init__(self, ids: list[int]) -> None:
        self.ids = tuple(ids)
        self.logprobs = tuple(-0.1 for _ in ids)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        yield GenerationChunk(self.ids, self.logprobs, "stop")

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def healthy(self) -> bool:
        return True


def _stub_app() -> Starlette:
    async def chat(request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": CANNED}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    return Starlette(routes=[Route("/{path:path}", chat, methods=["POST"])])


async def _serve_stub() -> tuple[uvicorn.Server, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the proxy does
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    config = uvicorn.Config(_stub_app(), log_level="warning", access_log=False, lifespan="off")
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    return server, sock.getsockname()[1]


def _big_conversation(n_tools: int, target_tokens: int, tok: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
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
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test in the repository."}]
    i = 0
    while len(tok.encode(json.dumps(messages))) < target_tokens:
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Step {i}: let me look at the next file."},
                    {
                        "type": "tool_use",
                        "id": f"tu{i}",
                        "name": f"tool_{i % n_tools}",
                        "input": {"path": f"src/m{i}.py"},
                    },
                ],
            }
        )
        result = "\n".join(f"line {j}: value = compute({i}, {j})  # comment about step {i}" for j in range(40))
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"tu{i}", "content": result}]}
        )
        i += 1
    return tools, messages


def _transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    options = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    return httpx.AsyncHTTPTransport(limits=limits, socket_options=options)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _latency(client: httpx.AsyncClient, url: str, body: Any, headers: dict[str, str], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        r = await client.post(url, json=body, headers=headers)
        out.append((time.perf_counter() - start) * 1000)
        assert r.status_code == 200, r.text
    return out


async def _throughput(url: str, body: Any, headers: dict[str, str], seconds: float, concurrency: int) -> float:
    done = 0
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30, transport=_transport(limits)) as client:

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                r = await client.post(url, json=body, headers=headers)
                assert r.status_code == 200
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - start)


async def _serve(fsync: bool) -> None:
    """Child process: start the stub and the proxy, print their ports, serve until stdin closes."""
    tok = build_tiny_tokenizer()
    ids = [*tok.encode(CANNED, add_special_tokens=False), tok.convert_tokens_to_ids("<|im_end|>")]
    state = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    settings = ProxySettings(state_dir=state, fsync=fsync, context_length=1 << 20)
    app = ProxyApp(settings, StubBackend(ids), tok)
    proxy_port = await app.start()
    stub_server, stub_port = await _serve_stub()
    _, token = await app.registry.open("bench", "policy")
    _, big_token = await app.registry.open("bench-big", "policy")
    info = {"proxy_port": proxy_port, "stub_port": stub_port, "token": token, "big_token": big_token}
    print(json.dumps(info), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    print(json.dumps({"records": await _count(app)}), flush=True)
    await app.stop()
    stub_server.should_exit = True
    await stub_server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--big-tokens", type=int, default=32000)
    parser.add_argument("--big-turns", type=int, default=20)
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(not args.no_fsync))
        return

    tok = build_tiny_tokenizer()
    cmd = [sys.executable, "-m", "bench.proxy_overhead", "--serve", *(["--no-fsync"] if args.no_fsync else [])]
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None
    assert child.stdout is not None
    info = json.loads(child.stdout.readline())
    token, big_token = info["token"], info["big_token"]
    proxy_port, stub_port = info["proxy_port"], info["stub_port"]

    small = {"model": "policy", "messages": [{"role": "user", "content": "What is 6 times 7?"}]}
    auth = {"authorization": f"Bearer {token}"}
    proxy_url = f"http://127.0.0.1:{proxy_port}/v1/chat/completions"
    stub_url = f"http://127.0.0.1:{stub_port}/v1/chat/completions"

    async def run_client() -> dict[str, Any]:
        res: dict[str, Any] = {}
        async with httpx.AsyncClient(timeout=60, transport=_transport(httpx.Limits())) as client:
            await _latency(client, stub_url, small, auth, 100)
            await _latency(client, proxy_url, small, auth, 100)
            res["direct_small"] = await _latency(client, stub_url, small, auth, args.requests)
            res["proxy_small"] = await _latency(client, proxy_url, small, auth, args.requests)
            tools, history = _big_conversation(25, args.big_tokens, tok)
            big_auth = {"x-api-key": big_token}
            anth_url = f"http://127.0.0.1:{proxy_port}/v1/messages"
            base = {"model": "policy", "max_tokens": 64, "system": "You are a coding agent.", "tools": tools}
            body = {**base, "messages": history}
            start = time.perf_counter()
            r = await client.post(anth_url, json=body, headers=big_auth)
            res["big_cold_ms"] = (time.perf_counter() - start) * 1000
            assert r.status_code == 200, r.text
            res["big_prompt_tokens"] = r.json()["usage"]["input_tokens"]
            direct, proxy = [], []
            for k in range(args.big_turns):
                history = [*history, {"role": "assistant", "content": CANNED}, {"role": "user", "content": f"next {k}"}]
                body = {**base, "messages": history}
                direct += await _latency(client, stub_url, body, big_auth, 1)
                proxy += await _latency(client, anth_url, body, big_auth, 1)
            res["direct_big"], res["proxy_big"] = direct, proxy
            res["direct_rps"] = await _throughput(stub_url, small, auth, args.seconds, args.concurrency)
            res["proxy_rps"] = await _throughput(proxy_url, small, auth, args.seconds, args.concurrency)
        return res

    try:
        res = asyncio.run(run_client())
    finally:
        out, _ = child.communicate("", timeout=60)
    records = json.loads(out.strip().splitlines()[-1])["records"]

    rows = []
    pairs = (("small chat call", "direct_small", "proxy_small"), ("Claude-Code-sized turn", "direct_big", "proxy_big"))
    for name, d, p in pairs:
        for q, label in ((0.5, "p50"), (0.99, "p99")):
            dv, pv = _pct(res[d], q), _pct(res[p], q)
            rows.append((f"{name} {label} (ms)", dv, pv, pv - dv, pv / dv))
    print(
        f"fsync={'off' if args.no_fsync else 'on'}; big prompt = {res['big_prompt_tokens']} tokens, 25 tools; "
        f"cold first big call {res['big_cold_ms']:.1f} ms; {records} records written"
    )
    print(f"{'metric':36s} {'direct':>10s} {'proxy':>10s} {'added':>10s} {'ratio':>7s}")
    for label, dv, pv, added, ratio in rows:
        print(f"{label:36s} {dv:10.3f} {pv:10.3f} {added:10.3f} {ratio:7.2f}")
    dr, pr = res["direct_rps"], res["proxy_rps"]
    label = f"peak req/s (one worker, c={args.concurrency})"
    print(f"{label:36s} {dr:10.0f} {pr:10.0f} {'':>10s} {pr / dr:7.2f}")
    print("LiteLLM comparison: not run (litellm[proxy] is not installed in this environment).")


async def _count(app: ProxyApp) -> int:
    return sum(len(app.registry.get(s).records) for s in ("bench", "bench-big"))


if __name__ == "__main__":
    main()
