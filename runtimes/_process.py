"""Run a host subprocess with a timeout, capturing bounded output and killing its whole process group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from runtimes.base import ExecResult

__all__ = ["DOWNLOAD_LIMIT_BYTES", "OUTPUT_LIMIT_BYTES", "run_process"]

# Test logs can be large; keep the tail, which holds the summary and the failure that ended the run.
OUTPUT_LIMIT_BYTES = 4 * 1024 * 1024
# The largest file ``download`` reads; anything bigger is refused with FileTooLarge, never read into memory.
DOWNLOAD_LIMIT_BYTES = 256 * 1024 * 1024
# After a kill, wait this long for pipes held by stray grandchildren before giving up on the rest.
_DRAIN_AFTER_KILL_S = 5.0


class _TailBuffer:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.limit:
            del self.data[: len(self.data) - self.limit]

    def text(self) -> str:
        return bytes(self.data).decode("utf-8", errors="replace")


async def _pump(stream: asyncio.StreamReader | None, sink: _TailBuffer) -> None:
    if stream is None:
        return
    while chunk := await stream.read(65536):
        sink.add(chunk)


def _kill_group(pid: int) -> None:
    # The child leads its own session (start_new_session), so its pid is the process-group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path | None,
    env: Mapping[str, str],
    timeout: float,  # noqa: ASYNC109 - enforced inside the sandbox, which kills the process group
    on_start: Callable[[int], None] | None = None,
    on_end: Callable[[int], None] | None = None,
    output_limit: int = OUTPUT_LIMIT_BYTES,
) -> ExecResult:
    """Run ``argv`` and wait up to ``timeout`` seconds; on timeout or cancellation kill its process group.

    Args:
        argv: Program and arguments.
        cwd: Working directory on the host.
        env: The complete environment of the child (nothing is inherited).
        timeout: Seconds before the process group is killed and ``timed_out`` is set.
        on_start: Called with the child's pid (process-group id) once it runs, so owners can kill it.
        on_end: Called with the same pid when it has exited.
        output_limit: Bytes of stdout and of stderr to keep (the tail).

    Returns:
        The exit status and captured output.
    """
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    if on_start is not None:
        on_start(proc.pid)
    out, err = _TailBuffer(output_limit), _TailBuffer(output_limit)
    pumps = [asyncio.create_task(_pump(proc.stdout, out)), asyncio.create_task(_pump(proc.stderr, err))]
    timed_out = False
    try:
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            timed_out = True
            _kill_group(proc.pid)
            await proc.wait()
        # Grandchildren that escaped the group may still hold the pipes; do not wait for them forever.
        _done, pending = await asyncio.wait(pumps, timeout=_DRAIN_AFTER_KILL_S)
        for task in pending:
            task.cancel()
    finally:
        if proc.returncode is None:
            _kill_group(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
        else:
            # The leader exited; its group may still have members (background jobs). Kill them too.
            _kill_group(proc.pid)
        for task in pumps:
            task.cancel()
        if on_end is not None:
            on_end(proc.pid)
    return ExecResult(
        exit_code=proc.returncode if proc.returncode is not None else -1,
        stdout=out.text(),
        stderr=err.text(),
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )
