"""The gateway's end of the proxy tunnel: one Unix-socket bridge per gateway process towards the proxy.

Runtimes with ``network: proxy`` have no network but their own loopback. Each gets this bridge's socket mounted
and a forwarder on ``127.0.0.1:<sandbox_port>`` inside (see :mod:`runtimes.tunnel`), so the harness reaches the
model proxy and nothing else. The session token tells sessions apart, so one bridge serves every session.

The proxy's HTTP address is learnt from the base URLs OpenSession returns, so the bridge starts with the
first session (and moves if the proxy ever reports another address).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from gateway.harnesses import rebase_endpoints
from gateway.models import ProxyEndpoints
from polar_core.errors import FailedPrecondition
from runtimes.tunnel import UnixSocketBridge

__all__ = ["ProxyTunnel"]

_log = logging.getLogger(__name__)
# sockaddr_un holds 108 bytes; leave room for the NUL and the file name.
_MAX_SOCKET_PATH = 100
_SOCKET_NAME = "proxy.sock"


class ProxyTunnel:
    """A lazily started :class:`UnixSocketBridge` to the proxy's HTTP port.

    Args:
        socket_dir: Directory that holds only the socket (Docker mounts the directory); created if missing.
        sandbox_port: The loopback port harnesses use inside sandboxes.
    """

    def __init__(self, socket_dir: Path, *, sandbox_port: int = 18080, owns_dir: bool = False) -> None:
        self.socket_path = socket_dir / _SOCKET_NAME
        self.sandbox_port = sandbox_port
        self._owns_dir = owns_dir
        self._bridge: UnixSocketBridge | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def under(cls, state_dir: Path, *, sandbox_port: int = 18080) -> ProxyTunnel:
        """A tunnel whose socket lives in ``state_dir/tunnel``, or in a private ``/tmp`` directory when that
        path would be too long for a Unix socket."""
        socket_dir = (state_dir / "tunnel").absolute()
        if len(str(socket_dir / _SOCKET_NAME)) <= _MAX_SOCKET_PATH:
            socket_dir.mkdir(parents=True, exist_ok=True)
            return cls(socket_dir, sandbox_port=sandbox_port)
        private = Path(tempfile.mkdtemp(prefix="polar-tunnel-"))
        private.chmod(0o711)  # a container's unprivileged user must reach the socket in it (mounted on its own)
        return cls(private, sandbox_port=sandbox_port, owns_dir=True)

    @property
    def sandbox_origin(self) -> str:
        """The proxy's origin as harnesses inside a sandbox reach it."""
        return f"http://127.0.0.1:{self.sandbox_port}"

    async def attach(self, endpoints: ProxyEndpoints) -> ProxyEndpoints:
        """Make sure the bridge forwards to the proxy named by ``endpoints``; return them rebased for sandboxes.

        Raises:
            FailedPrecondition: The endpoints carry no base URL with a host.
        """
        url = endpoints.anthropic_base_url or endpoints.openai_base_url or endpoints.google_base_url
        parts = urlsplit(url)
        if not parts.hostname:
            raise FailedPrecondition(f"the proxy returned no usable base URL ({url!r}) to tunnel to")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        async with self._lock:
            bridge = self._bridge
            if bridge is None or (bridge.target_host, bridge.target_port) != (parts.hostname, port):
                if bridge is not None:
                    _log.warning("the proxy moved to %s:%d; restarting the tunnel", parts.hostname, port)
                    await bridge.stop()
                bridge = UnixSocketBridge(parts.hostname, port, self.socket_path)
                await bridge.start()
                self._bridge = bridge
        return rebase_endpoints(endpoints, self.sandbox_origin)

    async def close(self) -> None:
        """Stop the bridge (cutting open connections), remove the socket (and a private directory). Idempotent."""
        async with self._lock:
            bridge, self._bridge = self._bridge, None
            if bridge is not None:
                await bridge.stop()
            if self._owns_dir:
                with contextlib.suppress(OSError):
                    self.socket_path.parent.rmdir()
