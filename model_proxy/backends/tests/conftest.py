"""Fixtures of the backend tests: fake inference servers served on loopback ports."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvicorn
from starlette.types import ASGIApp

Serve = Callable[[ASGIApp], Awaitable[str]]


def unused_port() -> int:
    """A loopback port that nothing listens on (bound once, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Serve an ASGI app on a free loopback port (uvicorn, in the test's event loop); returns its root URL."""
    servers: list[uvicorn.Server] = []

    async def start(app: ASGIApp) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=1)
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        servers.append(server)
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield start
    for server in servers:
        await server.shutdown()
