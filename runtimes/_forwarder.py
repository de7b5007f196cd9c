"""Runs inside a sandbox: serve 127.0.0.1:PORT by forwarding to a Unix socket, while running a command.

Standard library only; the local runtime copies this file into the session directory and wraps commands
with it when the network mode is ``proxy``. Usage::

    python3 _forwarder.py PORT SOCKET_PATH -- COMMAND [ARGS...]

It exits with the command's exit status; connections are forwarded until then.
"""

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _main(port: int, socket_path: str, argv: list[str]) -> int:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_unix_connection(socket_path)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    proc = await asyncio.create_subprocess_exec(*argv)
    code = await proc.wait()
    server.close()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sep = sys.argv.index("--")
    sys.exit(asyncio.run(_main(int(sys.argv[1]), sys.argv[2], sys.argv[sep + 1 :])))
