"""A user namespace an ordinary user owns, held open for the commands of one session to enter as its root.

``unshare --user --map-root-user`` maps this process's user, and only it, to root of a new user namespace. A holder
process keeps the namespace alive; commands enter it with ``nsenter --user --preserve-credentials`` and then hold
every capability *in it* (nothing on the host: the namespace maps no other host id). gVisor's ``runsc --rootless``
needs exactly this (``runsc do`` makes one for itself; ``run``/``exec``/``kill`` of one sandbox must share it).
The holder never outlives its owner (:mod:`runtimes._held`).
"""

from __future__ import annotations

import os

from runtimes._held import HeldProcess

__all__ = ["OwnUserNamespace"]

_HOLD = "import select, sys; select.select([int(sys.argv[1])], [], [])"


def _namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/user")
    except OSError:
        return None


class OwnUserNamespace(HeldProcess):
    """The holder of one user namespace."""

    @classmethod
    async def start(cls, python: str) -> OwnUserNamespace:
        """Make the namespace and wait until its holder is in it.

        Raises:
            RuntimeDied: This host does not let an ordinary user make a user namespace (the message says why).
        """
        process, lifeline = await cls.spawn(
            lambda fd: ["unshare", "--user", "--map-root-user", "--", python, "-I", "-S", "-c", _HOLD, str(fd)]
        )
        held = cls(process, lifeline)
        ours = _namespace("self")
        await held.wait_until(lambda: _namespace(process.pid) not in (None, ours), "cannot make a user namespace")
        return held

    def enter_argv(self) -> list[str]:
        """The command prefix that runs what follows as root of the namespace."""
        return ["nsenter", f"--user=/proc/{self.pid}/ns/user", "--preserve-credentials", "--"]
