"""A tunnel from a network-less sandbox to one host TCP service (the model proxy), through a Unix socket.

A sandbox made with ``bwrap --unshare-net`` or ``docker --network none`` has only its own loopback, so the
harness inside cannot reach the proxy, nor anything else. Two halves bridge exactly one service:

* host side, :class:`UnixSocketBridge`: listens on a Unix socket file and forwards each connection to the
  proxy's TCP port. The socket file is bind-mounted into the sandbox (a file-system socket, because abstract
  Unix sockets belong to a network namespace).
* sandbox side, ``python -m runtimes.tunnel --listen 127.0.0.1:PORT --connect /path/proxy.sock [-- CMD ...]``
  (or this file run as a script; it needs only the standard library): listens on the sandbox's loopback and
  forwards each connection to the socket. With a command after ``--`` it starts forwarding, runs the command,
  and exits with its status, so one argv both opens the tunnel and runs the harness.

Both halves pass bytes through unchanged in both directions and propagate half-closes (EOF), so HTTP,
server-sent events and gRPC all work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import stat
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["UnixSocketBridge", "forward_tcp_to_unix", "main", "pipe", "script_bytes", "wrap_command"]

_CHUNK = 65536
# Turns of the event loop that take a queued connection from the listening socket to a started handler, with one spare.
_ACCEPT_TURNS = 4


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until EOF, then half-close ``writer`` (or close it if it cannot)."""
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        else:
            writer.close()
    except (ConnectionError, OSError):
        # The other side went away; closing both ends (by the caller) is all there is to do.
        writer.close()


async def _splice(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    connect: Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]],
) -> None:
    try:
        up_r, up_w = await connect()
    except OSError:
        client_w.close()
        return
    except BaseException:  # cancelled while connecting (the bridge stopping): the client's end is closed too
        client_w.close()
        raise
    try:
        await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))
    finally:
        for w in (up_w, client_w):
            w.close()
            with contextlib.suppress(ConnectionError, OSError):
                await w.wait_closed()


class UnixSocketBridge:
    """Host side: accept connections on a Unix socket file and forward them to ``target_host:target_port``.

    Use as ``async with UnixSocketBridge(host, port, path):`` or call :meth:`start` and :meth:`stop`.

    Args:
        target_host: Host of the TCP service (the proxy), as this process reaches it.
        target_port: Its port.
        socket_path: Where to create the socket file; a stale socket there is replaced, any other file is not.
        mode: Permission bits of the socket file; the default lets a sandbox user with another uid connect
            (the directory holding it decides who can reach it).
    """

    def __init__(self, target_host: str, target_port: int, socket_path: Path, *, mode: int = 0o666) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.socket_path = Path(socket_path)
        self._mode = mode
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Every accepted connection, from the moment it is accepted: its handler task may not have started yet
        # when the bridge stops, and a task cancelled before its first step never closes its writer.
        self._transports: set[asyncio.Transport] = set()

    async def start(self) -> None:
        """Create the socket and start accepting. Raises ``FileExistsError`` if a non-socket is in the way."""
        if self._server is not None:
            return
        if self.socket_path.exists() or self.socket_path.is_symlink():
            if not stat.S_ISSOCK(self.socket_path.lstat().st_mode):
                raise FileExistsError(f"{self.socket_path} exists and is not a socket")
            self.socket_path.unlink()
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: _TrackedStreamProtocol(self._transports, self._handle), path=str(self.socket_path)
        )
        os.chmod(self.socket_path, self._mode)

    async def stop(self) -> None:
        """Stop accepting, cut open connections and remove the socket file. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        # No new client can connect once the file is gone. Connections already queued on the listening socket
        # are taken in by the loop within three turns (accept, then the transport, then the handler's task):
        # closing the server before that would leave them accepted but never closed (Python 3.11 asserts on
        # attaching a transport to a closed server, and the accepted socket is dropped open).
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        for _ in range(_ACCEPT_TURNS):
            await asyncio.sleep(0)
        server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for transport in list(self._transports):  # accepted, but its handler had not started
            if not transport.is_closing():
                transport.abort()
        self._transports.clear()
        await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None:  # accepted just before the bridge stopped
            writer.close()
            return
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await _splice(reader, writer, lambda: asyncio.open_connection(self.target_host, self.target_port))
        except asyncio.CancelledError:
            # Cut by :meth:`stop`: the connection is closed, and the stream server's done-callback would log a
            # cancelled handler as an error.
            if self._server is not None:
                raise
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def __aenter__(self) -> UnixSocketBridge:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


class _TrackedStreamProtocol(asyncio.StreamReaderProtocol):
    """A stream server's protocol that keeps its transport in ``transports`` while the connection is open."""

    def __init__(
        self,
        transports: set[asyncio.Transport],
        handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    ) -> None:
        super().__init__(asyncio.StreamReader(), handle)
        self._tracked = transports
        self._own: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.Transport):
            self._own = transport
            self._tracked.add(transport)
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._own is not None:
            self._tracked.discard(self._own)
        super().connection_lost(exc)


async def forward_tcp_to_unix(host: str, port: int, socket_path: str) -> asyncio.Server:
    """Sandbox side: listen on ``host:port`` and forward each connection to the Unix socket ``socket_path``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _splice(reader, writer, lambda: asyncio.open_unix_connection(socket_path))

    return await asyncio.start_server(handle, host, port)


async def _run(host: str, port: int, socket_path: str, command: Sequence[str]) -> int:
    server = await forward_tcp_to_unix(host, port, socket_path)
    if not command:
        async with server:
            await server.serve_forever()
        return 0
    try:
        proc = await asyncio.create_subprocess_exec(*command)
        code = await proc.wait()
    finally:
        # Not ``wait_closed``: a connection a leftover grandchild holds must not keep the command from ending.
        server.close()
    # A command killed by a signal exits the way a shell reports it.
    return code if code >= 0 else 128 - code


def wrap_command(
    python: str, script: str, *, port: int, socket_path: str, argv: Sequence[str], host: str = "127.0.0.1"
) -> list[str]:
    """The sandbox-side command line that opens the tunnel, runs ``argv`` and exits with its status.

    Args:
        python: The Python interpreter inside the sandbox.
        script: Where this file is inside the sandbox (it needs only the standard library).
        port: Loopback port to listen on inside the sandbox.
        socket_path: The bridge's Unix socket as the sandbox sees it.
        argv: The command to run; empty means forward until killed.
        host: Address to listen on.
    """
    head = [python, script, "--listen", f"{host}:{port}", "--connect", socket_path]
    return [*head, "--", *argv] if argv else head


def script_bytes() -> bytes:
    """The source of this module, for copying into a sandbox."""
    return Path(__file__).read_bytes()


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry of the sandbox side; returns the command's exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in args:
        split = args.index("--")
        args, command = args[:split], args[split + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m runtimes.tunnel", description="Forward a loopback port to a Unix socket."
    )
    parser.add_argument("--listen", required=True, help="HOST:PORT to listen on inside the sandbox")
    parser.add_argument("--connect", required=True, help="path of the Unix socket that reaches the proxy")
    parsed = parser.parse_args(args)
    host, _, port = str(parsed.listen).rpartition(":")
    return asyncio.run(_run(host or "127.0.0.1", int(port), str(parsed.connect), command))


if __name__ == "__main__":
    sys.exit(main())
