"""One model-proxy forwarder per session, in a network namespace the session's commands join (root only).

Without it, every command of a ``network: proxy`` sandbox started the forwarder of :mod:`runtimes.tunnel` inside
its own bubblewrap (a Python interpreter and asyncio per command, about 0.2 CPU-seconds a session, most of it in
commands that never call the model: ``git``, ``mkdir``, patch collection). A runtime started as root instead
makes one network namespace per session (``unshare --net``, loopback only, owned by the host's user namespace, so
no sandbox can reconfigure it), runs the forwarder there once, as the session's leased host id, and starts every
command's bubblewrap inside that namespace (``nsenter --net``, then ``--share-net``): commands that never
connect pay nothing. Commands of one session share its loopback (as in a container); sessions do not.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Sequence
from pathlib import Path

from runtimes.errors import RuntimeDied

__all__ = ["SessionForwarder"]

# Run as root in the new network namespace: bring loopback up, read the forwarder and import what it needs (the
# interpreter may live where the leased id cannot read, e.g. under /root), drop to the leased id, then run it.
_BOOT = """
import argparse, asyncio, asyncio.unix_events, collections.abc, contextlib, fcntl, os, pathlib, socket, stat
import gettext, selectors, shutil, signal, struct, sys, types, weakref
s = socket.socket()
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))
s.close()
code = compile(open(sys.argv[2], encoding="utf-8").read(), sys.argv[2], "exec")
uid = int(sys.argv[1])
os.setgroups([]); os.setgid(uid); os.setuid(uid)
sys.argv = sys.argv[2:]
exec(code, {"__name__": "__main__", "__file__": sys.argv[0]})
"""
_READY_S = 20.0
_TCP_LISTEN = "0A"


def _listening(pid: int, port: int) -> bool:
    """Whether ``127.0.0.1:port`` listens in the network namespace of ``pid``."""
    try:
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    wanted = f"0100007F:{port:04X}"
    return any(line.split()[1] == wanted and line.split()[3] == _TCP_LISTEN for line in lines)


class SessionForwarder:
    """The forwarder process of one session; its network namespace is the session's.

    Args:
        process: The running forwarder.
    """

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @property
    def netns(self) -> str:
        """The session's network namespace, for ``nsenter --net=``."""
        return f"/proc/{self._process.pid}/ns/net"

    @property
    def alive(self) -> bool:
        """Whether the forwarder still runs."""
        return self._process.returncode is None

    @classmethod
    async def start(
        cls, prefix: Sequence[str], *, python: str, script: Path, port: int, socket_path: Path, uid: int
    ) -> SessionForwarder:
        """Start the forwarder and wait until it listens.

        Args:
            prefix: What runs before it (the session's cgroups and rlimits).
            python: The host's Python.
            script: The forwarder (``runtimes/tunnel.py``), read as root before the id drops.
            port: The loopback port commands reach the proxy on.
            socket_path: The proxy's Unix socket, as ``uid`` reaches it.
            uid: The session's leased host id (uid and gid).

        Raises:
            RuntimeDied: It did not start listening.
        """
        argv = [*prefix, "unshare", "--net", "--", python, "-I", "-c", _BOOT, str(uid), str(script),
                "--listen", f"127.0.0.1:{port}", "--connect", str(socket_path)]  # fmt: skip
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            cwd="/",
            env={"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"},
            start_new_session=True,
        )
        forwarder = cls(process)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _READY_S
        while not _listening(process.pid, port):
            if process.returncode is not None or loop.time() > deadline:
                await forwarder.stop()
                err = b"" if process.stderr is None else await process.stderr.read()
                raise RuntimeDied(f"the session's proxy forwarder did not start: {err.decode(errors='replace')[-300:]}")
            await asyncio.sleep(0.02)
        return forwarder

    async def stop(self) -> None:
        """Kill the forwarder (its network namespace goes with the last process in it). Idempotent."""
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(signal.SIGKILL)
        await self._process.wait()
