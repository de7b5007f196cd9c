"""Listeners on this host's own addresses that a sandbox must never reach, for the egress tests.

A sandbox's way out of this host would go through one of the host's interfaces; a listener that is really
accepting on the host's own non-loopback address (read from the interfaces, never by sending a packet) is the
nearest thing beyond the sandbox, so a sandbox that cannot reach it has no way out, and the tests contact no
address outside this machine. Standard library only (the red-team script runs under the system's Python).
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

__all__ = ["UDP_PREFIX", "accepted", "host_address", "listener", "received", "udp_listener"]

UDP_PREFIX = "udp/"
"""A probe target ``udp/HOST:PORT`` is a datagram (answered by :func:`udp_listener`'s owner), not a TCP connect."""
_SIOCGIFADDR = 0x8915


def host_address() -> str:
    """An IPv4 address of one of this host's own non-loopback interfaces (what a sandbox must not reach).

    Raises:
        RuntimeError: The host has no such address (then there is no way out of it to test).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on this interface
            address = ipaddress.IPv4Address(packed[20:24])
            if not (address.is_loopback or address.is_link_local or address.is_unspecified):
                return str(address)
    raise RuntimeError("this host has no non-loopback IPv4 address to listen on for the egress probes")


def listener(host: str) -> socket.socket:
    """A non-blocking TCP listener on ``host`` (a free port) that a sandbox must never reach."""
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen(16)
    sock.setblocking(False)
    return sock


def accepted(sock: socket.socket) -> int:
    """How many connections ``sock`` accepted so far (each closed)."""
    count = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def udp_listener(host: str) -> socket.socket:
    """A non-blocking UDP socket on ``host`` (a free port) that a sandbox's datagrams must never reach."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    sock.setblocking(False)
    return sock


def received(sock: socket.socket) -> int:
    """How many datagrams ``sock`` received so far."""
    count = 0
    while True:
        try:
            sock.recvfrom(65536)
        except BlockingIOError:
            return count
        count += 1
