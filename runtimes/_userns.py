"""A user namespace an ordinary user owns, held open for the commands of one session to enter as its root.

``unshare --user --map-root-user`` maps this process's user, and only it, to root of a new user namespace. A holder
process keeps the namespace alive; commands enter it with ``nsenter --user --preserve-credentials`` and then hold
every capability *in it* (nothing on the host: the namespace maps no other host id). gVisor's ``runsc --rootless``
needs exactly this (``runsc do`` makes one for itself; ``run``/``exec``/``kill`` of one sandbox must share it).
The holder watches a pipe this process holds, so it never outlives its owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from runtimes.errors import RuntimeDied

__all__ = ["OwnUserNamespace"]

_HOLD = "import select, sys; select.select([int(sys.argv[1])], [], [])"
_READY_S = 20.0


def _namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/user")
    except OSError:
        return None


class OwnUserNamespace:
    """The holder of one user namespace.

    Args:
        process: The holder.
        lifeline: The write end of the pipe the holder watches.
    """

    def __init__(self, process: asyncio.subprocess.Process, lifeline: int) -> None:
        self._process = process
        self._lifeline = lifeline

    @classmethod
    async def start(cls, python: str) -> OwnUserNamespace:
        """Make the namespace and wait until its holder is in it.

        Raises:
            RuntimeDied: This host does not let an ordinary user make a user namespace (the message says why).
        """
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            process = await asyncio.create_subprocess_exec(
                "unshare", "--user", "--map-root-user", "--", python, "-I", "-S", "-c", _HOLD, str(read_end),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                cwd="/", env={"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}, start_new_session=True,
                pass_fds=(read_end,),
            )  # fmt: skip
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        held = cls(process, write_end)
        ours = _namespace("self")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _READY_S
        while _namespace(process.pid) in (None, ours):
            if process.returncode is not None or loop.time() > deadline:
                await held.stop()
                err = b"" if process.stderr is None else await process.stderr.read()
                raise RuntimeDied(f"cannot make a user namespace: {err.decode(errors='replace').strip()[-300:]}")
            await asyncio.sleep(0.01)
        return held

    def enter_argv(self) -> list[str]:
        """The command prefix that runs what follows as root of the namespace."""
        return ["nsenter", f"--user=/proc/{self._process.pid}/ns/user", "--preserve-credentials", "--"]

    async def stop(self) -> None:
        """End the holder (the namespace goes with the last process in it). Idempotent."""
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(signal.SIGKILL)
        await self._process.wait()
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1
