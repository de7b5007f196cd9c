"""Run one command in a gVisor sandbox and leave nothing of it behind (``python3 _reaper.py TIMEOUT ARGV...``).

Standard library only: it is copied into the sandbox's read-only root and run by the Python the sandbox sees, as
the sandbox user. It runs the command and, when the command ends (or after ``TIMEOUT`` seconds: exit status 124),
sends ``SIGKILL`` to every process it may signal (``kill(-1)``: the sandbox user's, never pid 1, never itself) until
none is left. A process-group kill is not enough under gVisor: a fork bomb's children, reparented to pid 1, are
not found by ``kill(-pgid)`` once their group's leader has exited, and would outlive the command holding the
sandbox's process limit. The runtime runs one command at a time, so this kills nothing but the command's own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time


class _Expired(Exception):
    pass


def _expire(signum: int, frame: object) -> None:
    raise _Expired


def _sweep() -> None:
    for _ in range(100000):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        time.sleep(0.005)


def main(argv: list[str]) -> int:
    timeout, command = float(argv[0]), argv[1:]
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"{command[0]}: {exc.strerror}", file=sys.stderr)
        os._exit(127)
    signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, max(timeout, 0.001))
    try:
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code
    except _Expired:
        code = 124
    signal.setitimer(signal.ITIMER_REAL, 0)
    if os.geteuid() != 0:  # kill(-1) as root would reach far more than the command's own processes
        _sweep()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
