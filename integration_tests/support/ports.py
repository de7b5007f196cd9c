"""Free TCP ports for servers a test starts on a port it chose beforehand.

A port the kernel hands out for ``bind(0)`` lies in the ephemeral range, the range it also draws the source ports
of outgoing connections from. Between choosing such a port and the server binding it, any outgoing connection on
the machine (another test's client) may be given it; and a client that dials the not-yet-listening server itself
(the rollout server retrying a gateway that is still starting) can be given it as its own source port, which on
loopback connects *to itself* (a TCP self-connect). Either way the port is held and the server fails with
"address in use" (seen once in CI). Ports chosen here lie below the ephemeral range, which the kernel never
assigns on its own, so only another test choosing the same port can collide, and binding checks that.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
from pathlib import Path

_LOWEST = 10000


def _ephemeral_floor() -> int:
    """The lowest port the kernel assigns to outgoing connections (32768 when unreadable)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int, *, host: str = "127.0.0.1", consecutive: bool = False) -> list[int]:
    """Return ``count`` distinct TCP ports below the ephemeral range that were free on ``host`` a moment ago.

    Args:
        count: How many ports.
        host: The address they must be free on (``""`` for every address).
        consecutive: Whether they must be one block ``base, base + 1, ...``.
    """
    ceiling = _ephemeral_floor()
    if ceiling - _LOWEST < 1000:
        ceiling = 65535
    for _ in range(500):
        if consecutive:
            base = _LOWEST + secrets.randbelow(ceiling - _LOWEST - count)
            candidates = list(range(base, base + count))
        else:
            candidates = list({_LOWEST + secrets.randbelow(ceiling - _LOWEST) for _ in range(count)})
            if len(candidates) < count:
                continue
        try:
            with contextlib.ExitStack() as stack:
                for port in candidates:
                    sock = stack.enter_context(socket.socket())
                    sock.bind((host, port))
            return candidates
        except OSError:
            continue
    raise RuntimeError(f"no {count} free ports below {ceiling} on {host!r}")


def free_port(host: str = "127.0.0.1") -> int:
    """One TCP port below the ephemeral range that was free on ``host`` a moment ago."""
    return free_ports(1, host=host)[0]
