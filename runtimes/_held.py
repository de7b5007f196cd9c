"""Helper processes that never outlive the runtime's process (a session's forwarder, its user namespace's holder).

Each watches the read end of a pipe whose write end only this process holds: when this process ends, however it
ends, the helper sees end-of-file and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable

from runtimes.errors import RuntimeDied

__all__ = ["HeldProcess"]

_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}


class HeldProcess:
    """A running helper and the write end of its lifeline.

    Args:
        process: The helper.
        lifeline: The write end of the pipe the helper watches.
    """

    def __init__(self, process: asyncio.subprocess.Process, lifeline: int) -> None:
        self._process = process
        self._lifeline = lifeline

    @staticmethod
    async def spawn(argv: Callable[[int], list[str]]) -> tuple[asyncio.subprocess.Process, int]:
        """Start ``argv(read end of the lifeline)`` in a session of its own; ``(process, write end)``."""
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv(read_end), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, cwd="/", env=_ENV, start_new_session=True, pass_fds=(read_end,),
            )  # fmt: skip
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        return process, write_end

    @property
    def pid(self) -> int:
        """The helper's pid."""
        return self._process.pid

    @property
    def alive(self) -> bool:
        """Whether the helper still runs."""
        return self._process.returncode is None

    async def wait_until(self, ready: Callable[[], bool], failure: str, *, limit_s: float = 20.0) -> None:
        """Poll ``ready`` until it holds; else stop the helper and raise.

        Raises:
            RuntimeDied: The helper ended, or ``ready`` did not hold within ``limit_s`` (``failure``, then what the
                helper wrote to stderr).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while not ready():
            if self._process.returncode is not None or loop.time() > deadline:
                await self.stop()
                err = b"" if self._process.stderr is None else await self._process.stderr.read()
                raise RuntimeDied(f"{failure}: {err.decode(errors='replace').strip()[-300:]}")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Kill the helper and close the lifeline. Idempotent."""
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(signal.SIGKILL)
        await self._process.wait()
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1
