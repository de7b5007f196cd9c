"""Micro-benchmark of HTTP clients for the proxy's backend hop (one keep-alive connection, calls one at a time).

Run: ``.venv/bin/python -m bench.proxy_overhead.clients`` (``--calls N``). The stub of
:mod:`bench.proxy_overhead.stub` runs in a process of its own and answers ``/v1/completions`` at once; this
process sends vLLM-shaped bodies (a small prompt and a 35k-ID prompt) and prints, per client and body, the
round trip's p50 and this process's CPU per call (encoding the body and decoding the answer included):

* ``httpx json=`` -- today's hop: ``httpx.AsyncClient.stream(..., json=body)``, ``response.json()``.
* ``httpx + orjson`` -- the same client, the body encoded by orjson and sent as bytes.
* ``aiohttp + orjson`` -- one ``aiohttp.ClientSession`` (its connection pool), orjson both ways.
* ``raw asyncio + orjson`` -- a bare HTTP/1.1 keep-alive protocol (:class:`bench.proxy_overhead.load.Connection`),
  the floor any client can reach on this event loop.

Also printed: the encoder alone (``json.dumps`` vs ``orjson.dumps``) on the 35k-ID body.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import httpx
import orjson

from bench.proxy_overhead.load import build_request, connect
from bench.proxy_overhead.servers import canned_ids, start_child
from polar_core.model_fixtures import build_tiny_tokenizer

Body = dict[str, Any]
Call = Callable[[Body], Awaitable[Any]]


def vllm_body(n_ids: int) -> Body:
    """A body like the ``vllm`` backend's, with an ``n_ids``-token prompt."""
    return {
        "model": "policy",
        "prompt": [(i * 7919) % 150000 for i in range(n_ids)],
        "max_tokens": 64,
        "temperature": 1.0,
        "top_p": 1.0,
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stop_token_ids": [151645],
        "stream": False,
    }


async def _measure(call: Call, body: Body, calls: int, warmup: int) -> tuple[float, float]:
    """p50 round trip (ms) and CPU per call (ms) of this process."""
    for _ in range(warmup):
        await call(body)
    times = []
    cpu = time.process_time()
    for _ in range(calls):
        start = time.perf_counter()
        answer = await call(body)
        times.append((time.perf_counter() - start) * 1000)
        assert answer["choices"][0]["token_ids"], answer
    cpu_ms = (time.process_time() - cpu) / calls * 1000
    return statistics.median(times), cpu_ms


async def _clients(port: int) -> list[tuple[str, Call, Callable[[], Awaitable[None]]]]:
    url = f"http://127.0.0.1:{port}"
    plain = httpx.AsyncClient(base_url=url)
    fast = httpx.AsyncClient(base_url=url)
    session = aiohttp.ClientSession(base_url=url, connector=aiohttp.TCPConnector(limit=0))
    raw = await connect(port)
    headers = {"content-type": "application/json"}

    async def httpx_json(body: Body) -> Any:
        async with plain.stream("POST", "/v1/completions", json=body) as response:
            await response.aread()
            return response.json()

    async def httpx_orjson(body: Body) -> Any:
        async with fast.stream("POST", "/v1/completions", content=orjson.dumps(body), headers=headers) as response:
            return orjson.loads(await response.aread())

    async def aiohttp_orjson(body: Body) -> Any:
        async with session.post("/v1/completions", data=orjson.dumps(body), headers=headers) as response:
            return orjson.loads(await response.read())

    async def raw_orjson(body: Body) -> Any:
        status, answer = await raw.send(build_request(port, "/v1/completions", orjson.dumps(body), {}))
        assert status == 200
        return orjson.loads(answer)

    async def close_raw() -> None:
        assert raw.transport is not None
        raw.transport.close()

    return [
        ("httpx json= (today)", httpx_json, plain.aclose),
        ("httpx + orjson", httpx_orjson, fast.aclose),
        ("aiohttp + orjson", aiohttp_orjson, session.close),
        ("raw asyncio + orjson", raw_orjson, close_raw),
    ]


async def _run(port: int, calls: int, rounds: int) -> dict[str, dict[str, list[tuple[float, float]]]]:
    bodies = {"small": vllm_body(30), "35k": vllm_body(35000)}
    clients = await _clients(port)
    results: dict[str, dict[str, list[tuple[float, float]]]] = {
        name: {"small": [], "35k": []} for name, _, _ in clients
    }
    # Interleaved rounds: drift from the other load on the machine hits every client alike.
    for _ in range(rounds):
        for name, call, _ in clients:
            for kind, body in bodies.items():
                n = calls if kind == "small" else max(20, calls // 10)
                results[name][kind].append(await _measure(call, body, n, warmup=max(5, n // 10)))
    for _, _, close in clients:
        await close()
    return results


def _encoders(repeat: int = 50) -> list[tuple[str, float]]:
    body = vllm_body(35000)
    out = []
    encoders: list[tuple[str, Callable[[], bytes]]] = [
        ("json.dumps().encode()", lambda: json.dumps(body).encode()),
        ("orjson.dumps()", lambda: orjson.dumps(body)),
    ]
    for name, encode in encoders:
        start = time.perf_counter()
        for _ in range(repeat):
            encode()
        out.append((name, (time.perf_counter() - start) / repeat * 1000))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="HTTP clients for the backend hop")
    parser.add_argument("--calls", type=int, default=1000, help="small calls per client per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    stub = start_child("bench.proxy_overhead.stub", json.dumps(canned_ids(build_tiny_tokenizer())))
    try:
        results = asyncio.run(_run(stub.info["port"], args.calls, args.rounds))
    finally:
        stub.stop()
    print("| client | small p50 ms | small CPU ms/call | 35k-ID p50 ms | 35k-ID CPU ms/call |")
    print("|---|---|---|---|---|")
    for name, kinds in results.items():
        cells = []
        for kind in ("small", "35k"):
            p50 = statistics.median(r[0] for r in kinds[kind])
            cpu = statistics.median(r[1] for r in kinds[kind])
            cells += [f"{p50:.3f}", f"{cpu:.3f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    print("| encoder (35k-ID body) | ms |")
    print("|---|---|")
    for name, ms in _encoders():
        print(f"| {name} | {ms:.2f} |")


if __name__ == "__main__":
    main()
