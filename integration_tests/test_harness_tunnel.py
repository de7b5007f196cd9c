"""The Unix-socket tunnel (runtimes.tunnel): bytes both ways, and from a network-less sandbox only the proxy."""

from __future__ import annotations

import asyncio
import gc
import logging
import shutil
import sys
from pathlib import Path

import pytest

from integration_tests.support.egress import accepted, host_address, listener
from runtimes.tunnel import UnixSocketBridge, forward_tcp_to_unix


async def _echo_server() -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()  # until the client half-closes
        writer.write(b"echo:" + data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _http_server() -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = b"hello from the host"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_bytes_flow_both_ways_with_half_close(tmp_path: Path) -> None:
    server, port = await _echo_server()
    sock_path = tmp_path / "proxy.sock"
    async with server, UnixSocketBridge("127.0.0.1", port, sock_path):
        assert sock_path.is_socket()
        inner = await forward_tcp_to_unix("127.0.0.1", 0, str(sock_path))
        async with inner:
            inner_port = inner.sockets[0].getsockname()[1]
            payload = bytes(range(256)) * 1000
            for _ in range(3):  # several connections through the same bridge
                reader, writer = await asyncio.open_connection("127.0.0.1", inner_port)
                writer.write(payload)
                writer.write_eof()
                assert await reader.read() == b"echo:" + payload
                writer.close()
                await writer.wait_closed()
    assert not sock_path.exists()


async def test_bridge_refuses_to_replace_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("x")
    with pytest.raises(FileExistsError):
        await UnixSocketBridge("127.0.0.1", 1, path).start()


async def _holding_server() -> tuple[asyncio.Server, int]:
    """A target that accepts and never answers: a bridged connection stays open until someone closes it."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize("turns", [0, 1, 2, 3, 5, 8])
async def test_stopping_closes_every_connection_whatever_its_handler_had_reached(
    tmp_path: Path, turns: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Connections accepted just before the bridge stops (handler not started, or still connecting) are closed.

    Stopped after ``turns`` turns of the event loop, the bridge has accepted some of the clients, started some
    handlers, and some are connecting to the target. Every client must see its connection end; a handler that
    started after the stop, or was cancelled while connecting, used to keep it open and leak the socket.
    """
    server, port = await _holding_server()
    sock_path = tmp_path / "proxy.sock"
    async with server:
        bridge = UnixSocketBridge("127.0.0.1", port, sock_path)
        await bridge.start()
        clients = [await asyncio.open_unix_connection(str(sock_path)) for _ in range(4)]
        for _ in range(turns):
            await asyncio.sleep(0)
        await bridge.stop()
        for reader, writer in clients:
            assert await asyncio.wait_for(reader.read(), 20) == b""
            writer.close()
    for _ in range(3):  # no transport of the bridge is left for the collector to find unclosed
        await asyncio.sleep(0)
    gc.collect()
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_sandbox_reaches_the_proxy_and_nothing_else(tmp_path: Path) -> None:
    server, port = await _http_server()
    # Listeners really accepting on this host's own interface address, on every address and on that address only:
    # the way out of the host. The sandbox must reach none of them, nor the proxy's own port, only the tunnel.
    lan = host_address()
    outside = [listener("0.0.0.0"), listener(lan)]
    targets = [("127.0.0.1", port), *((lan, sock.getsockname()[1]) for sock in outside)]
    sock_dir = tmp_path / "sock"
    sock_path = sock_dir / "proxy.sock"
    inner_port = 18080
    probe = f"""
import socket, sys, urllib.request
body = urllib.request.urlopen("http://127.0.0.1:{inner_port}/x", timeout=10).read()
print("BODY", body.decode())
for host, port in {targets!r}:
    try:
        socket.create_connection((host, port), timeout=3).close()
        print("REACHED", host, port)
    except OSError as exc:
        print("BLOCKED", host, port, type(exc).__name__)
"""
    async with server, UnixSocketBridge("127.0.0.1", port, sock_path):
        argv = [
            "bwrap", "--unshare-net", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev",
            "--proc", "/proc", "--bind", str(sock_dir), str(sock_dir),
            sys.executable, "-m", "runtimes.tunnel", "--listen", f"127.0.0.1:{inner_port}",
            "--connect", str(sock_path), "--", sys.executable, "-c", probe,
        ]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    reached = sum(accepted(sock) for sock in outside)
    for sock in outside:
        sock.close()
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    assert "BODY hello from the host" in text
    assert "REACHED" not in text
    assert text.count("BLOCKED") == len(targets) == 3
    assert reached == 0
