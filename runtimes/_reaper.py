"""Run one command in a gVisor sandbox and leave nothing of it behind (``python3 _reaper.py TIMEOUT ARGV...``).

Standard library only: it is copied into the sandbox's read-only root and run by the Python the sandbox sees. It
starts the command in a new session and, when the command ends (or after ``TIMEOUT`` seconds: exit status 124),
stops every process of that session (``SIGSTOP``, until none runs: a stopped process cannot fork), then kills
them all. A process-group kill
is not enough under gVisor: a fork bomb's children, reparented to pid 1, are not found by ``kill(-pgid)`` once
their group's leader has exited, and would outlive the command holding the sandbox's process limit. A process
that leaves the session (``setsid``) on purpose survives the command, as it would leave a process group in a
container; the sandbox's ``RLIMIT_NPROC`` still bounds it, and ``stop`` ends it.
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


def _members(sid: int) -> dict[int, str]:
    """Live (not zombie) processes of session ``sid`` and their states."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{entry}/stat") as fh:
                    text = fh.read()
                fields = text[text.rindex(")") + 2 :].split()
                if fields[0] not in "ZX" and int(fields[3]) == sid:
                    found[int(entry)] = fields[0]
    return found


def _signal_all(pids: dict[int, str], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def _sweep(sid: int) -> None:
    """Stop every process of the session (a stopped process cannot fork), then kill them all; at most ~20 s."""
    deadline = time.monotonic() + 5.0
    seen: set[int] = set()
    while time.monotonic() < deadline:
        members = _members(sid)
        if set(members) <= seen and all(state in "Tt" for state in members.values()):
            break  # no new process since the last scan, and every one stopped
        seen |= set(members)
        _signal_all(members, signal.SIGSTOP)
        time.sleep(0.01)
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        members = _members(sid)
        if not members:
            return
        _signal_all(members, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        time.sleep(0.01)


def main(argv: list[str]) -> int:
    timeout, command = float(argv[0]), argv[1:]
    pid = os.fork()
    if pid == 0:
        os.setsid()
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"{command[0]}: {exc.strerror}", file=sys.stderr)
        os._exit(127)
    signal.signal(signal.SIGALRM, _expire)
    # SIGTERM: the runtime's caller gave up on the command (its exec was cancelled): end it the same way.
    signal.signal(signal.SIGTERM, _expire)
    signal.setitimer(signal.ITIMER_REAL, max(timeout, 0.001))
    try:
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code
    except _Expired:
        code = 124
    signal.setitimer(signal.ITIMER_REAL, 0)
    _sweep(pid)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
