"""Attacks a hostile agent tries from inside a local-runtime sandbox; run in-process or as a script.

Standard library and :mod:`runtimes` only, so a test can run it as an unprivileged host user with the
system's Python (``runuser -u USER -- python3 -m integration_tests.support.sandbox_attacks BASE``): it prints
one JSON object, attack name -> ``{"exit_code", "stdout", "stderr", "timed_out"}`` plus a few host-side facts
(``host_file``: the read-only file's content afterwards; ``outsider_alive``: whether the process outside the
sandbox survived).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from runtimes import ExecResult, RuntimeSpec
from runtimes.local import LocalRuntime

__all__ = ["ATTACKS", "LIMITS", "run_attacks"]

LIMITS: dict[str, Any] = {"pids_limit": 64, "memory_limit": "256m", "file_size_limit": "64m", "cpu_time_limit_s": 30}
"""The limits the attacked sandbox runs with."""

_FORK_COUNT = """
import os, time
n = 0
try:
    for _ in range(500):
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
except OSError as exc:
    print("refused", exc.errno)
print("forked", n)
"""

ATTACKS: dict[str, str] = {
    "capabilities": "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; id -u",
    "remount": 'mount -o remount,bind,rw "$RO_DIR" && echo pwned > "$RO_DIR/secret.txt"',
    "write_read_only": 'echo pwned > "$RO_DIR/secret.txt"',
    "kill_outsider": 'kill -9 "$OUTSIDER"',
    "ptrace_outsider": (
        'python3 -c "import ctypes,sys; libc=ctypes.CDLL(None, use_errno=True); '
        'sys.exit(0 if libc.ptrace(16, int(sys.argv[1]), 0, 0) == 0 else 1)" "$OUTSIDER"'
    ),
    "read_other_session": 'cat "$OTHER/secret.txt"',
    "list_sessions": 'ls "$BASE"',
    "new_user_namespace": "unshare -U true",
    "fork_count": f"python3 -c '{_FORK_COUNT}'",
    "fork_bomb": "bomb() { bomb | bomb & }; bomb; sleep 3; echo survived",
    "memory_bomb": "python3 -c 'b = bytearray(2 * 1024 ** 3); print(len(b))'",
    "memory_grow": "python3 -c 'x = []\nwhile True: x.append(bytearray(10 ** 7))'",
    "sparse_file": "truncate -s 2G big.bin; echo rc=$?; stat -c %s big.bin",
    "disk_fill": "dd if=/dev/zero of=fill.bin bs=1M count=200 2>/dev/null; echo rc=$?; stat -c %s fill.bin",
    "etc": (
        "for f in /etc/shadow /etc/gshadow /etc/sudoers /etc/gitconfig /etc/npmrc /etc/machine-id "
        "/etc/ssl/private; do [ -e $f ] && echo present $f; done; ls /etc | grep -i polar; "
        "cat /etc/hostname; hostname; echo done"
    ),
}


def _summary(result: ExecResult) -> dict[str, Any]:
    return {"exit_code": result.exit_code, "stdout": result.stdout[-4000:], "stderr": result.stderr[-2000:],
            "timed_out": result.timed_out}  # fmt: skip


async def run_attacks(base_dir: Path) -> dict[str, Any]:
    """Run every attack in a fresh sandbox below ``base_dir``; return the outcomes and host-side facts."""
    ro_dir = base_dir / "readonly"
    ro_dir.mkdir(parents=True, exist_ok=True)
    (ro_dir / "secret.txt").write_text("original\n")
    spec = RuntimeSpec(read_only_paths=(ro_dir,), **LIMITS)
    victim = LocalRuntime(spec, session_id="victim", base_dir=base_dir / "sessions")
    attacker = LocalRuntime(spec, session_id="attacker", base_dir=base_dir / "sessions")
    outsider = subprocess.Popen(["sleep", "120"])  # noqa: ASYNC220 - a host process for the attacks to aim at
    await victim.start()
    await attacker.start()
    try:
        await victim.upload(b"victim secret\n", "secret.txt")
        env = {"RO_DIR": str(ro_dir), "OUTSIDER": str(outsider.pid), "OTHER": str(victim.root),
               "BASE": str(base_dir / "sessions")}  # fmt: skip
        out: dict[str, Any] = {}
        for name, script in ATTACKS.items():
            out[name] = _summary(await attacker.exec(["sh", "-c", script], env=env, timeout=30))
        probe = await attacker.exec(["sh", "-c", "echo alive"], timeout=30)
        out["after"] = _summary(probe)
    finally:
        await attacker.stop()
        await victim.stop()
        alive = outsider.poll() is None
        outsider.kill()
        outsider.wait()
    out["host_file"] = (ro_dir / "secret.txt").read_text()
    out["outsider_alive"] = alive
    out["host_uid"] = os.getuid()
    return out


def main() -> None:
    """Script entry: ``sandbox_attacks BASE_DIR`` prints the outcomes as JSON."""
    print(json.dumps(asyncio.run(run_attacks(Path(sys.argv[1])))))


if __name__ == "__main__":
    main()
