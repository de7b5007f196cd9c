"""A gVisor session as this process's user: whose host ids its processes have, what its commands may write.

Run as an ordinary user (``runuser -u USER -- python3 -m integration_tests.support.gvisor_probe BASE``) by
``test_runtime_gvisor.py``; prints one JSON object (or ``{"unavailable": reason}`` where gVisor cannot run).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from integration_tests.support.forwarder_probe import CALL, PORT, serve_echo
from runtimes import NetworkMode, RuntimeSpec
from runtimes.gvisor import GVisorRuntime, probe_gvisor


def _ids_of_processes_naming(marker: str) -> dict[int, list[int]]:
    """Host uids (real, effective, saved, fs) of every process whose command line names ``marker``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        if marker.encode() in cmdline:
            uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
            found[int(entry)] = [int(x) for x in uid_line.split()[1:]]
    return found


def _owner(path: Path) -> int:
    return path.stat().st_uid


async def probe(base: Path) -> dict[str, Any]:
    reason = await probe_gvisor()
    if reason is not None:
        return {"unavailable": reason}
    sock_path = base / "proxy.sock"
    server = await asyncio.start_unix_server(serve_echo, path=str(sock_path))
    spec = RuntimeSpec(network=NetworkMode.PROXY, proxy_socket=sock_path, proxy_port=PORT, disk_limit=None)
    rt = GVisorRuntime(spec, session_id="rootless", base_dir=base / "rt")
    out: dict[str, Any] = {"host_uid": os.getuid()}
    await rt.start()
    try:
        out["sandbox_processes"] = _ids_of_processes_naming(rt.sandbox_id)
        wrote = await rt.exec(["sh", "-c", "id -u; mkdir -p d; echo hi > d/f; cat d/f"], timeout=60)
        out["wrote"] = (wrote.exit_code, wrote.stdout.split(), wrote.stderr[-300:])
        out["file_owner"] = _owner(rt.host_root / "d" / "f")
        dev = await rt.exec(["sh", "-c", "echo x > /dev/pwned; chmod 777 /dev; echo y > /dev/null; echo done"],
                            timeout=60)  # fmt: skip
        out["dev"] = (dev.stdout.strip(), dev.stderr.strip())
        call = await rt.exec(["python3", "-c", CALL], timeout=60)
        out["call"] = (call.exit_code, call.stdout.strip(), call.stderr[-300:])
    finally:
        await rt.stop()
        server.close()
    await asyncio.sleep(0.5)
    out["left_after_stop"] = _ids_of_processes_naming(rt.sandbox_id)
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(probe(Path(sys.argv[1])))))
