"""The Unix-socket tunnel (runtimes.tunnel): bytes both ways, and from a network-less sandbox only the proxy."""

from __future__ import annotations

import asyncio
import shutil
import socket
import sys
from pathlib import Path

import pytest

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


def _host_address() -> str:
    # An address of a non-loopback interface of this host (what a sandbox must not reach).
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent for UDP connect
            return str(s.getsockname()[0])
        except OSError:
            return "10.255.255.1"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_sandbox_reaches_the_proxy_and_nothing_else(tmp_path: Path) -> None:
    server, port = await _http_server()
    sock_dir = tmp_path / "sock"
    sock_path = sock_dir / "proxy.sock"
    inner_port = 18080
    probe = f"""
import socket, sys, urllib.request
body = urllib.request.urlopen("http://127.0.0.1:{inner_port}/x", timeout=10).read()
print("BODY", body.decode())
for host, port in (("127.0.0.1", {port}), ("{_host_address()}", {port}), ("1.1.1.1", 443)):
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
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    assert "BODY hello from the host" in text
    assert "REACHED" not in text
    assert text.count("BLOCKED") == 3
