"""A small HTTP/1.1 keep-alive load generator (raw asyncio, no HTTP library in the measured path).

:func:`latencies` sends requests one at a time on one connection and returns each round trip in
milliseconds. :func:`peak_rps` starts several client processes (``python -m bench.proxy_overhead.load``), each
running closed-loop connections against the same server over the same time window, and returns the
completed requests per second of all of them together.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["Connection", "build_request", "connect", "cpu_ns", "latencies", "peak_rps", "settle", "timed"]

_SETTLE_WINDOW_S = 0.005
_SETTLE_BUSY_NS = 250_000  # more CPU than this in one window (5% of it) means a server is still working


def build_request(port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """One HTTP/1.1 POST request, ready to send."""
    head = f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head += f"content-length: {len(body)}\r\n\r\n"
    return head.encode() + body


class Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    @property
    def closed(self) -> bool:
        """Whether the server closed the connection (uvicorn drops keep-alive connections idle for 5 s)."""
        return self.transport is None or self.transport.is_closing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("connection closed"))

    def data_received(self, data: bytes) -> None:
        self._buf += data
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = self._buf[:end].split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = -1
        chunked = False
        for header in lines[1:]:
            name, _, value = header.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        rest = self._buf[end + 4 :]
        if chunked:
            body = _dechunk(rest)
            if body is None:
                return
            consumed = len(rest)
        else:
            if len(rest) < max(length, 0):
                return
            body, consumed = rest[: max(length, 0)], max(length, 0)
        self._buf = rest[consumed:]
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result((status, body))

    async def send(self, request: bytes) -> tuple[int, bytes]:
        assert self.transport is not None
        if self.transport.is_closing():  # a write would vanish and the answer never come
            raise ConnectionError("connection closed")
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self._waiter


def _dechunk(data: bytes) -> bytes | None:
    out = b""
    pos = 0
    while True:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(data[pos:eol].split(b";")[0], 16)
        if len(data) < eol + 2 + size + 2:
            return None
        out += data[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2
        if size == 0:
            return out


async def connect(port: int) -> Connection:
    """Open a keep-alive connection to ``127.0.0.1:port``."""
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(Connection, "127.0.0.1", port)
    return client


async def timed(client: Connection, request: bytes) -> float:
    """Send one request; its round trip in ms (raises on a non-200 answer)."""
    start = time.perf_counter()
    status, body = await client.send(request)
    elapsed = (time.perf_counter() - start) * 1000
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
    return elapsed


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of process ``pid`` so far, in nanoseconds (``/proc/<pid>/task/*/schedstat``).

    Nanosecond resolution, unlike ``/proc/<pid>/stat``'s clock ticks (10 ms here). 0 when it cannot be read.
    """
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total


async def settle(pids: list[int], *, timeout_s: float = 2.0) -> float:
    """Wait until the processes ``pids`` are idle: together they use < 5% of a core over a 5 ms window.

    A server may go on working after it answered (LiteLLM runs its logging and spend callbacks then); on a
    machine with few cores that work would land on whichever server is measured next. Returns the CPU they
    used while this waited, in ms (from the call to the end of the wait; gives up after ``timeout_s``).
    """
    pids = [p for p in pids if p > 0]
    if not pids:
        return 0.0
    start = last = sum(cpu_ns(p) for p in pids)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await asyncio.sleep(_SETTLE_WINDOW_S)
        now = sum(cpu_ns(p) for p in pids)
        if now - last < _SETTLE_BUSY_NS:
            return (now - start) / 1e6
        last = now
    return (last - start) / 1e6


async def latencies(port: int, requests: list[bytes]) -> list[float]:
    """Send ``requests`` one after another on one connection; round trips in ms (raises on a non-200)."""
    client = await connect(port)
    try:
        out = [await timed(client, request) for request in requests]
    finally:
        assert client.transport is not None
        client.transport.close()
    return out


async def _closed_loop(port: int, requests: list[bytes], start_at: float, seconds: float) -> tuple[int, int]:
    clients = [await connect(port) for _ in requests]
    done = errors = 0
    await asyncio.sleep(max(0.0, start_at - time.time()))
    stop = time.perf_counter() + seconds

    async def run(client: Connection, request: bytes) -> None:
        nonlocal done, errors
        while True:
            status, _ = await client.send(request)
            if time.perf_counter() >= stop:
                return
            if status == 200:
                done += 1
            else:
                errors += 1

    await asyncio.gather(*(run(c, r) for c, r in zip(clients, requests, strict=True)))
    for client in clients:
        assert client.transport is not None
        client.transport.close()
    return done, errors


def peak_rps(port: int, requests: list[bytes], *, seconds: float, processes: int) -> tuple[float, int]:
    """Closed-loop load from ``processes`` processes; ``requests[i]`` is connection i's request (spread evenly).

    Returns:
        Completed requests per second (all processes) and the number of non-200 answers.
    """
    start_at = time.time() + 1.0 + 0.3 * processes
    children = []
    with tempfile.TemporaryDirectory(prefix="proxy-bench-load-") as tmp:
        for p in range(processes):
            mine = requests[p::processes]
            path = Path(tmp) / f"requests-{p}.json"
            path.write_text(json.dumps([r.decode("latin-1") for r in mine]))
            cmd = [sys.executable, "-m", "bench.proxy_overhead.load", str(port), str(path), str(start_at), str(seconds)]
            children.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
        done = errors = 0
        for child in children:
            out, _ = child.communicate(timeout=seconds + 60)
            result = json.loads(out)
            done += result["done"]
            errors += result["errors"]
    return done / seconds, errors


def _main() -> None:
    parser = argparse.ArgumentParser(description="one load-generating process (see peak_rps)")
    parser.add_argument("port", type=int)
    parser.add_argument("requests", type=Path)
    parser.add_argument("start_at", type=float)
    parser.add_argument("seconds", type=float)
    args = parser.parse_args()
    requests = [r.encode("latin-1") for r in json.loads(args.requests.read_text())]
    done, errors = asyncio.run(_closed_loop(args.port, requests, args.start_at, args.seconds))
    print(json.dumps({"done": done, "errors": errors}))


if __name__ == "__main__":
    _main()
