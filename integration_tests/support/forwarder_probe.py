"""A local runtime on ``network: proxy`` as this process's user: what its commands start, and what they reach.

Run as an ordinary user by ``test_runtime_local.py``
(``runuser -u USER -- python3 -m integration_tests.support.forwarder_probe BASE [no-userns]``); prints one JSON
object. A Unix-socket server stands in for the model proxy (it answers
``proxy:`` and what it read); the runtime's commands reach it on the loopback port, through the session's one
forwarder (runtimes._forwarder) or, where there is none, the one each command starts.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from runtimes import Isolation, NetworkMode, RuntimeSpec
from runtimes._forwarder import SessionForwarder
from runtimes.errors import RuntimeDied
from runtimes.local import LocalRuntime

PORT = 18557
# A model call stand-in: connect to the proxy port, send "hello", print the answer.
CALL = f"""
import socket
s = socket.create_connection(("127.0.0.1", {PORT}), timeout=10)
s.sendall(b"hello")
s.shutdown(socket.SHUT_WR)
print(s.recv(100).decode())
"""

# Take the session's loopback down (SIOCSIFFLAGS without IFF_UP): the namespace is not the sandbox's to configure.
_LO_DOWN = """
import fcntl, socket, struct
s = socket.socket()
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags & ~1))
"""


def descendants(leader: int) -> list[int]:
    """``leader`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, stack = [], [leader]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def process_names(pids: list[int]) -> list[str]:
    """The command names (``comm``) of those of ``pids`` still running."""
    names = []
    for pid in pids:
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            continue
    return names


async def serve_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The proxy's stand-in: answer ``proxy:`` and what the client sent."""
    data = await reader.read()
    writer.write(b"proxy:" + data)
    await writer.drain()
    writer.close()


async def probe(base: Path, *, no_user_namespace: bool = False) -> dict[str, Any]:
    """Start the runtime, run a command that never calls the model and one that does, then stop it.

    ``no_user_namespace`` makes the session's forwarder fail to start, as where an ordinary user cannot make a
    user namespace: the runtime falls back to one forwarder per command.
    """
    if no_user_namespace:

        async def refuse(*args: object, **kwargs: object) -> SessionForwarder:
            raise RuntimeDied("unshare: unshare failed: Operation not permitted")

        SessionForwarder.start = refuse  # type: ignore[method-assign,assignment]
    sock_path = base / "proxy.sock"
    server = await asyncio.start_unix_server(serve_echo, path=str(sock_path))
    spec = RuntimeSpec(isolation=Isolation.BWRAP, network=NetworkMode.PROXY, proxy_socket=sock_path, proxy_port=PORT)
    rt = LocalRuntime(spec, session_id="fwd", base_dir=base / "rt")
    out: dict[str, Any] = {"host_uid": os.getuid(), "host_gid": os.getgid()}
    await rt.start()
    try:
        forwarder = rt._forwarder
        out["session_forwarder"] = forwarder is not None and forwarder.rootless
        out["forwarder_pid"] = forwarder.pid if forwarder is not None else None
        command = asyncio.create_task(rt.exec(["sh", "-c", "sleep 30 & sleep 30; wait"], timeout=60))
        names: list[str] = []
        for _ in range(100):  # until both sleeps run
            await asyncio.sleep(0.1)
            names = process_names([pid for group in rt._live_groups for pid in descendants(group)])
            if names.count("sleep") == 2:
                break
        out["command_processes"] = names
        command.cancel()
        calls = [await rt.exec([sys.executable, "-c", CALL], timeout=60) for _ in range(2)]
        out["calls"] = [(c.exit_code, c.stdout.strip(), c.stderr[-300:]) for c in calls]
        inside = await rt.exec(["sh", "-c", "id -u; id -g"], timeout=30)
        out["ids_inside"] = inside.stdout.split()
        lo_down = await rt.exec([sys.executable, "-c", _LO_DOWN], timeout=30)
        out["lo_down"] = (lo_down.exit_code, lo_down.stderr.strip()[-200:])
        out["calls_after_lo_down"] = (await rt.exec([sys.executable, "-c", CALL], timeout=60)).stdout.strip()
    finally:
        await rt.stop()
        server.close()
    pid = out["forwarder_pid"]
    out["forwarder_left"] = pid is not None and _alive(pid)
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(probe(Path(sys.argv[1]), no_user_namespace=sys.argv[2:] == ["no-userns"]))))
