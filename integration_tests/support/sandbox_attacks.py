"""Attacks a hostile agent tries from inside a sandbox; run in-process or as a script.

Standard library, :mod:`runtimes` and :mod:`integration_tests.support.egress` only, so a test can run it as an
unprivileged host user with the system's Python
(``runuser -u USER -- python3 -m integration_tests.support.sandbox_attacks BASE``): it prints one JSON object,
attack name -> ``{"exit_code", "stdout", "stderr", "timed_out"}`` plus host-side facts (``host_file``: the
read-only file's content afterwards; ``outsider_alive``: whether the process outside the sandbox survived;
``victim_alive``: whether the other session's command survived; ``secrets``: the host directory standing for
the proxy's records and the gateway's state, afterwards; ``accepted``: connections and datagrams that the host's
listeners on 127.0.0.1 and on its own interface address received; ``symlinks``: what the runtime's
upload/download did with links the agent planted; ``quota``: the disk-fill run against a small quota).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from integration_tests.support.egress import UDP_PREFIX, accepted, host_address, listener, received, udp_listener
from runtimes import ExecResult, Isolation, Runtime, RuntimeSpec
from runtimes._quota import allocated_bytes
from runtimes.factory import create_runtime
from runtimes.gvisor import GVisorRuntime
from runtimes.local import LocalRuntime

__all__ = [
    "ATTACKS",
    "CANARY_NAME",
    "LIMITS",
    "NETWORK_PROBE",
    "QUOTA_FILL",
    "QUOTA_FILL_BYTES",
    "QUOTA_LIMIT",
    "accepted",
    "egress_targets",
    "host_address",
    "listener",
    "run_attacks",
    "symlink_attacks",
]

LIMITS: dict[str, Any] = {"pids_limit": 64, "memory_limit": "256m", "file_size_limit": "64m", "cpu_time_limit_s": 30,
                          "tmp_size": "32m", "disk_limit": "1g"}  # fmt: skip
"""The limits the attacked sandbox runs with."""
QUOTA_LIMIT = "128m"
"""The disk quota of the sandbox that fills its disk."""
CANARY_NAME = "POLAR_REDTEAM_CANARY"
"""A variable of the host process (and of the process outside the sandbox) that no sandbox may read."""

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

NETWORK_PROBE = """
import socket, sys
for target in sys.argv[1:]:
    udp = target.startswith("udp/")
    host, port = target.removeprefix("udp/").rsplit(":", 1)
    try:
        if udp:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.sendto(b"probe", (host, int(port)))
        else:
            socket.create_connection((host, int(port)), timeout=3).close()
        print("connected", target)
    except OSError as exc:
        print("refused", target, exc.errno)
"""
"""``python3 -c NETWORK_PROBE [udp/]HOST:PORT...``: one line per target, ``connected`` (a TCP connection, or a
datagram sent) or ``refused``."""

QUOTA_FILL = ("for i in $(seq 1 64); do dd if=/dev/zero of=fill$i.bin bs=1M count=60 2>/tmp/dd.err "
              "|| { head -n 1 /tmp/dd.err; exit 28; }; done; sleep 30")  # fmt: skip
"""Fills the workspace with 60 MiB files (under the file size limit) far past :data:`QUOTA_LIMIT`; stops with exit
status 28 and dd's error at the first write the file system refuses (a session image of the quota's size),
else waits for the watchdog."""
QUOTA_FILL_BYTES = 64 * 60 * 2**20
"""What :data:`QUOTA_FILL` writes when nothing stops it."""

ATTACKS: dict[str, str] = {
    "capabilities": "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; id -u",
    "remount": 'mount -o remount,bind,rw "$RO_DIR" && echo pwned > "$RO_DIR/secret.txt"',
    "write_read_only": 'echo pwned > "$RO_DIR/secret.txt"',
    "kill_outsider": 'kill -9 "$OUTSIDER"',
    "kill_everything": "kill -9 -1; echo rc=$?",
    "ptrace_outsider": (
        'python3 -c "import ctypes,sys; libc=ctypes.CDLL(None, use_errno=True); '
        'sys.exit(0 if libc.ptrace(16, int(sys.argv[1]), 0, 0) == 0 else 1)" "$OUTSIDER"'
    ),
    "read_other_session": 'cat "$OTHER/secret.txt"',
    "write_other_session": 'echo pwned > "$OTHER/secret.txt"',
    "list_sessions": 'ls "$BASE"',
    "read_records": 'ls "$SECRETS"; cat "$SECRETS/records.jsonl" "$SECRETS/session.json"',
    "credentials": (
        f"env | grep {CANARY_NAME}; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < $f; "
        f"done 2>/dev/null | grep {CANARY_NAME}; echo scanned"
    ),
    "network": 'python3 -c "$NETWORK_PROBE" $TARGETS',
    "new_user_namespace": "unshare -U true",
    "fork_count": f"python3 -c '{_FORK_COUNT}'",
    "fork_bomb": "bomb() { bomb | bomb & }; bomb; sleep 3; echo survived",
    "memory_bomb": "python3 -c 'b = bytearray(2 * 1024 ** 3); print(len(b))'",
    "memory_grow": "python3 -c 'x = []\nwhile True: x.append(bytearray(10 ** 7))'",
    "sparse_file": "truncate -s 2G big.bin; echo rc=$?; wc -c < big.bin",
    "disk_fill": "dd if=/dev/zero of=fill.bin bs=1M count=200 2>/dev/null; echo rc=$?; wc -c < fill.bin",
    "tmp_fill": "dd if=/dev/zero of=/tmp/fill bs=1M count=60 2>/dev/null; wc -c < /tmp/fill; rm -f /tmp/fill",
    "shm_fill": "dd if=/dev/zero of=/dev/shm/fill bs=1M count=60 2>/dev/null; wc -c < /dev/shm/fill",
    "dev_write": "echo pwned > /dev/pwned",
    "etc": (
        "for f in /etc/shadow /etc/gshadow /etc/sudoers /etc/gitconfig /etc/npmrc /etc/machine-id "
        "/etc/ssl/private; do [ -e $f ] && echo present $f; done; ls /etc | grep -i polar; "
        "cat /etc/hostname; hostname; echo done"
    ),
    "plant_symlinks": (
        'ln -s /etc/shadow shadow; ln -s "$SECRETS" secrets; ln -s "$SECRETS/records.jsonl" records; '
        'ln -s "$HOST_TARGET" target; mkdir -p up && ln -s "$SECRETS" up/sub; cat shadow records; echo planted'
    ),
}


def _summary(result: ExecResult) -> dict[str, Any]:
    return {"exit_code": result.exit_code, "stdout": result.stdout[-4000:], "stderr": result.stderr[-2000:],
            "timed_out": result.timed_out}  # fmt: skip


async def _outcome(call: Awaitable[Any]) -> str:
    """``ok`` or the name of the exception the call raised."""
    try:
        await call
    except Exception as exc:
        return type(exc).__name__
    return "ok"


async def symlink_attacks(runtime: Runtime, secrets_dir: Path, host_target: Path) -> dict[str, str]:
    """After ``plant_symlinks`` ran in ``runtime``: what its download and upload do with the links.

    ``download_*`` must raise (never return a host file); ``upload_*`` must either raise or write inside the
    session directory only (the test then checks the host target and secrets directory are unchanged).
    """
    out = {
        "download_shadow": await _outcome(runtime.download("shadow")),
        "download_records": await _outcome(runtime.download("records")),
        "download_through_dir": await _outcome(runtime.download("secrets/records.jsonl")),
        "upload_over_file_link": await _outcome(runtime.upload(b"pwned\n", "target")),
        "upload_through_dir_link": await _outcome(runtime.upload(b"pwned\n", "secrets/new.txt")),
    }
    with tempfile.TemporaryDirectory() as name:
        tree = Path(name)
        (tree / "sub").mkdir()
        (tree / "sub" / "planted.txt").write_text("pwned\n")
        out["upload_tree_over_dir_link"] = await _outcome(runtime.upload(tree, "up"))
    return out


def egress_targets() -> tuple[list[socket.socket], list[socket.socket], list[str]]:
    """Listeners a sandbox must never reach and the probe targets naming them: TCP on 127.0.0.1, TCP on every
    address (probed at the host's own interface address), TCP and UDP bound to that interface address only (standing
    for everything beyond the host: no test contacts an address outside this machine).

    Returns:
        The TCP listeners (count with :func:`accepted`), the UDP sockets (count with :func:`received`) and the
        targets for :data:`NETWORK_PROBE`.
    """
    lan = host_address()
    loopback, anywhere, on_lan = listener("127.0.0.1"), listener("0.0.0.0"), listener(lan)
    datagrams = udp_listener(lan)
    targets = [f"127.0.0.1:{loopback.getsockname()[1]}", f"{lan}:{anywhere.getsockname()[1]}",
               f"{lan}:{on_lan.getsockname()[1]}", f"{UDP_PREFIX}{lan}:{datagrams.getsockname()[1]}"]  # fmt: skip
    return [loopback, anywhere, on_lan], [datagrams], targets


def _runtime(spec: RuntimeSpec, session_id: str, base_dir: Path) -> LocalRuntime | GVisorRuntime:
    """The runtime ``create_runtime`` builds for ``spec`` (``isolation: gvisor``: the gVisor runtime)."""
    runtime = create_runtime(spec, session_id=session_id, base_dir=base_dir)
    assert isinstance(runtime, LocalRuntime | GVisorRuntime)
    return runtime


async def _quota_attack(base_dir: Path, isolation: Isolation) -> dict[str, Any]:
    """Fill a sandbox with a small quota; report what the runtime did and what was left on the host."""
    spec = RuntimeSpec(**{**LIMITS, "disk_limit": QUOTA_LIMIT}, isolation=isolation)
    filler = _runtime(spec, "filler", base_dir / "sessions")
    await filler.start()
    try:
        try:
            result = await filler.exec(["sh", "-c", QUOTA_FILL], timeout=60)
            raised, message = "", json.dumps(_summary(result))
        except Exception as exc:
            raised, message = type(exc).__name__, str(exc)
        os.sync()  # the loop device writes the image's blocks when its file system flushes
        host_bytes = allocated_bytes(filler.host_root)
        # Where the session has an image of its own, what it occupies on the host's disk.
        images = list((base_dir / "sessions" / ".polar-disks").glob("*.img"))
        image_bytes = images[0].stat().st_blocks * 512 if images else None
        later = await _outcome(filler.exec(["true"], timeout=30))
    finally:
        await filler.stop()
    return {"raised": raised, "message": message, "host_bytes": host_bytes, "image_bytes": image_bytes,
            "later": later, "removed": not (base_dir / "sessions" / "filler").exists(),
            "images_left": [p.name for p in (base_dir / "sessions" / ".polar-disks").glob("filler*")]}  # fmt: skip


async def run_attacks(base_dir: Path, isolation: Isolation = Isolation.AUTO) -> dict[str, Any]:
    """Run every attack in a fresh sandbox below ``base_dir``; return the outcomes and host-side facts.

    ``isolation``: the sandboxes' (``auto``: the local runtime's strongest namespace level; ``gvisor``: the gVisor
    runtime).
    """
    ro_dir = base_dir / "readonly"
    ro_dir.mkdir(parents=True, exist_ok=True)
    (ro_dir / "secret.txt").write_text("original\n")
    secrets_dir = base_dir / "secrets"  # stands for the proxy's records and the gateway's state directory
    secrets_dir.mkdir(exist_ok=True)
    (secrets_dir / "records.jsonl").write_text('{"token": "record-secret"}\n')
    (secrets_dir / "session.json").write_text('{"token": "session-secret"}\n')
    host_target = base_dir / "host-target.txt"
    host_target.write_text("original\n")
    canary = secrets.token_hex(16)
    os.environ[CANARY_NAME] = canary  # the host process's and the outsider's environment
    tcp, udp, targets = egress_targets()
    spec = RuntimeSpec(read_only_paths=(ro_dir,), **LIMITS, isolation=isolation)
    victim = _runtime(spec, "victim", base_dir / "sessions")
    attacker = _runtime(spec, "attacker", base_dir / "sessions")
    await victim.start()
    await attacker.start()
    # After the starts: a runtime that cannot start must not leave it holding a caller's pipes for 120 s.
    outsider = subprocess.Popen(["sleep", "120"])  # noqa: ASYNC220 - a host process for the attacks to aim at
    victim_command: asyncio.Task[ExecResult] | None = None
    out: dict[str, Any] = {"canary": canary, "targets": targets, "isolation": isolation.value}
    try:
        await victim.upload(b"victim secret\n", "secret.txt")
        victim_command = asyncio.create_task(victim.exec(["sleep", "300"], timeout=600))
        env = {"RO_DIR": str(ro_dir), "OUTSIDER": str(outsider.pid), "OTHER": str(victim.host_root),
               "BASE": str(base_dir / "sessions"), "SECRETS": str(secrets_dir), "HOST_TARGET": str(host_target),
               "NETWORK_PROBE": NETWORK_PROBE, "TARGETS": " ".join(targets)}  # fmt: skip
        for name, script in ATTACKS.items():
            out[name] = _summary(await attacker.exec(["sh", "-c", script], env=env, timeout=30))
        out["symlinks"] = await symlink_attacks(attacker, secrets_dir, host_target)
        out["after"] = _summary(await attacker.exec(["sh", "-c", "echo alive"], timeout=30))
        out["victim_alive"] = not victim_command.done()
        out["quota"] = await _quota_attack(base_dir, isolation)
        out["victim_after_quota"] = _summary(await victim.exec(["cat", "secret.txt"], timeout=30))
    finally:
        if victim_command is not None:
            victim_command.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await victim_command
        await attacker.stop()
        await victim.stop()
        alive = outsider.poll() is None
        outsider.kill()
        outsider.wait()
        out["accepted"] = sum(accepted(sock) for sock in tcp) + sum(received(sock) for sock in udp)
        for sock in (*tcp, *udp):
            sock.close()
        os.environ.pop(CANARY_NAME, None)
    out["host_file"] = (ro_dir / "secret.txt").read_text()
    out["host_target"] = host_target.read_text()
    out["secrets"] = sorted(p.name for p in secrets_dir.iterdir())
    out["secrets_unchanged"] = (secrets_dir / "records.jsonl").read_text() == '{"token": "record-secret"}\n'
    out["outsider_alive"] = alive
    out["host_uid"] = os.getuid()
    return out


def main() -> None:
    """Script entry: ``sandbox_attacks BASE_DIR [ISOLATION]`` prints the outcomes as JSON."""
    isolation = Isolation(sys.argv[2]) if len(sys.argv) > 2 else Isolation.AUTO
    print(json.dumps(asyncio.run(run_attacks(Path(sys.argv[1]), isolation))))


if __name__ == "__main__":
    main()
