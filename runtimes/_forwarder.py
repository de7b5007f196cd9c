"""One model-proxy forwarder per session, in a network namespace the session's commands join.

Without it, every command of a ``network: proxy`` sandbox started the forwarder of :mod:`runtimes.tunnel` inside
its own bubblewrap (a Python interpreter and asyncio per command, about 0.2 CPU-seconds a session, most of it in
commands that never call the model: ``git``, ``mkdir``, patch collection). A runtime instead makes one network
namespace per session (loopback only), runs the forwarder there once, and starts every command's bubblewrap inside
that namespace (``nsenter``, then ``--share-net``): commands that never connect pay nothing. Commands of one
session share its loopback (as in a container); sessions do not.

* Started as root (``uid`` given): ``unshare --net``, a namespace owned by the host's user namespace, so no sandbox
  can reconfigure it; the forwarder drops to the session's leased host id once it listens.
* Started as an ordinary user (``uid=None``): ``unshare --user --map-root-user --net``, a user namespace of its
  own that owns the network namespace; commands enter both (``nsenter --user --net --preserve-credentials``) and
  bubblewrap then makes each sandbox's user namespace a child of it, where no capability over the namespace
  reaches. The forwarder stays the runtime's own user, as the sandboxes are then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

from runtimes._held import HeldProcess

__all__ = ["SessionForwarder"]

# Run as root in the new network namespace (the host's root, or root of its own user namespace): bring loopback up,
# listen, read the forwarder's source, and drop to the leased id (a uid of -1: stay). Then wait for the first
# connection before paying for asyncio (socket activation: a session that never calls the model pays one bare
# interpreter start). The interpreter may live where the leased id cannot read (under /root): its library is
# imported through the staged binds of runtimes._hostids (``ORIGINAL=STAGED`` arguments).
_BOOT = """
import fcntl, os, select, socket, struct, sys
uid, script, port, target, lifeline = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
s = socket.socket()
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))
s.close()
listener = socket.socket()
listener.bind(("127.0.0.1", port))
listener.listen(128)
source = open(script, encoding="utf-8").read()
if uid >= 0:
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
for pair in sys.argv[6:]:
    old, new = pair.split("=", 1)
    sys.path = [new + p[len(old):] if p == old or p.startswith(old + "/") else p for p in sys.path]
if lifeline in select.select([listener, lifeline], [], [])[0]:
    sys.exit(0)  # the runtime's process ended without stopping us
import asyncio
tunnel = {"__name__": "polar_tunnel"}
exec(compile(source, script, "exec"), tunnel)
async def handle(reader, writer):
    await tunnel["_splice"](reader, writer, lambda: asyncio.open_unix_connection(target))
async def serve():
    ended = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().add_reader(lifeline, lambda: ended.done() or ended.set_result(None))
    server = await asyncio.start_server(handle, sock=listener)
    await ended
    server.close()
asyncio.run(serve())
"""
_TCP_LISTEN = "0A"


def _listening(pid: int, port: int) -> bool:
    """Whether ``127.0.0.1:port`` listens in the network namespace of ``pid``."""
    try:
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    wanted = f"0100007F:{port:04X}"
    return any(line.split()[1] == wanted and line.split()[3] == _TCP_LISTEN for line in lines)


class SessionForwarder(HeldProcess):
    """The forwarder process of one session; its network namespace is the session's. It never outlives its
    runtime's process (:mod:`runtimes._held`)."""

    def __init__(self, process: asyncio.subprocess.Process, lifeline: int, *, rootless: bool = False) -> None:
        super().__init__(process, lifeline)
        self._rootless = rootless

    @property
    def netns(self) -> str:
        """The session's network namespace, for ``nsenter --net=``."""
        return f"/proc/{self.pid}/ns/net"

    @property
    def rootless(self) -> bool:
        """Whether the namespace is owned by a user namespace of its own (started as an ordinary user)."""
        return self._rootless

    def enter_argv(self) -> list[str]:
        """The command prefix that runs what follows in the session's network namespace."""
        if self._rootless:
            return ["nsenter", f"--user=/proc/{self.pid}/ns/user", f"--net={self.netns}",
                    "--preserve-credentials", "--"]  # fmt: skip
        return ["nsenter", f"--net={self.netns}", "--"]

    @classmethod
    async def start(
        cls,
        prefix: Sequence[str],
        *,
        python: str,
        script: Path,
        port: int,
        socket_path: Path,
        uid: int | None,
        staged: Mapping[Path, Path],
    ) -> SessionForwarder:
        """Start the forwarder and wait until it listens (it starts forwarding at the first connection).

        Args:
            prefix: What runs before it (the session's cgroups and rlimits).
            python: The host's Python.
            script: The forwarder (``runtimes/tunnel.py``), read before the id drops.
            port: The loopback port commands reach the proxy on.
            socket_path: The proxy's Unix socket, as ``uid`` reaches it.
            uid: The session's leased host id (uid and gid), started as root; ``None``: this process's user, in a
                user namespace of the forwarder's own.
            staged: Host paths ``uid`` reaches only through a staged bind (the interpreter's prefixes among them).

        Raises:
            RuntimeDied: It did not start listening.
        """
        unshare = ["unshare", "--net"] if uid is not None else ["unshare", "--user", "--map-root-user", "--net"]
        staged_args = [f"{old}={new}" for old, new in staged.items() if old != new]

        def argv(lifeline_fd: int) -> list[str]:
            boot = [str(-1 if uid is None else uid), str(script), str(port), str(socket_path), str(lifeline_fd)]
            return [*prefix, *unshare, "--", python, "-I", "-S", "-c", _BOOT, *boot, *staged_args]

        process, lifeline = await cls.spawn(argv)
        forwarder = cls(process, lifeline, rootless=uid is None)
        await forwarder.wait_until(lambda: _listening(process.pid, port), "the session's proxy forwarder did not start")
        return forwarder
