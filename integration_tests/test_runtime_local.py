"""The local runtime with real bubblewrap: isolation of files, environment and network; timeouts; cancel."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from integration_tests.support import forwarder_probe
from integration_tests.support.forwarder_probe import descendants, process_names
from integration_tests.support.unprivileged import run_module_as, unprivileged_dir
from runtimes import Isolation, NetworkMode, PathEscapesSession, RuntimeCancelled, RuntimeDied, RuntimeSpec
from runtimes.errors import DiskQuotaExceeded, DiskSpaceUnavailable
from runtimes.local import LocalRuntime

_REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture
async def runtime(tmp_path: Path):
    rt = LocalRuntime(RuntimeSpec(isolation=Isolation.BWRAP), session_id="s1", base_dir=tmp_path / "rt")
    await rt.start()
    yield rt
    await rt.stop()


async def test_upload_exec_download(runtime: LocalRuntime, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / ".git").mkdir(parents=True)
    (src / "a.txt").write_text("hello")
    await runtime.upload(src, "repo", exclude=[".git"])
    result = await runtime.exec(["sh", "-c", "cat a.txt > b.txt; ls -a"], cwd="repo", timeout=10)
    assert result.ok
    assert ".git" not in result.stdout.split()
    assert await runtime.download("repo/b.txt") == b"hello"
    await runtime.upload(b"bytes", runtime.root / "x" / "y.bin")
    assert await runtime.download("x/y.bin") == b"bytes"


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "repo/../../x"])
async def test_paths_escaping_the_session_are_refused(runtime: LocalRuntime, path: str) -> None:
    with pytest.raises(PathEscapesSession):
        await runtime.upload(b"x", path)
    with pytest.raises(PathEscapesSession):
        await runtime.download(path)


async def test_symlink_out_of_the_session_is_refused(runtime: LocalRuntime, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    os.symlink(secret, runtime.host_root / "link")
    with pytest.raises(PathEscapesSession):
        await runtime.download("link")
    os.symlink(tmp_path, runtime.host_root / "dirlink")
    with pytest.raises(PathEscapesSession):
        await runtime.upload(b"x", "dirlink/planted.txt")
    assert not (tmp_path / "planted.txt").exists()


async def test_home_tmpdir_and_clean_environment(runtime: LocalRuntime, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("POLAR_TEST_SECRET", "leak")
    result = await runtime.exec(["sh", "-c", 'echo "$HOME|$TMPDIR|${POLAR_TEST_SECRET:-none}"'], timeout=10)
    assert result.stdout.strip() == f"{runtime.root}/home|{runtime.root}/tmp|none"
    # Host files outside the session directory (here: the test's tmp dir) are not visible.
    (tmp_path / "outside.txt").write_text("x")
    probe = await runtime.exec(["test", "-e", str(tmp_path / "outside.txt")], timeout=10)
    assert probe.exit_code != 0
    # The session directory is writable, the system is not.
    assert (await runtime.exec(["touch", "home/f"], timeout=10)).ok
    assert not (await runtime.exec(["touch", "/usr/polar-test"], timeout=10)).ok


@pytest.fixture
def host_port():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server.getsockname()[1]
    server.close()


CONNECT = "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3); print('ok')"


async def test_network_is_isolated(runtime: LocalRuntime, host_port: int) -> None:
    result = await runtime.exec(["python3", "-c", CONNECT, str(host_port)], timeout=20)
    assert result.exit_code != 0
    assert "ok" not in result.stdout


async def test_host_network_mode_reaches_the_host(tmp_path: Path, host_port: int) -> None:
    rt = LocalRuntime(
        RuntimeSpec(isolation=Isolation.BWRAP, network=NetworkMode.HOST), session_id="s2", base_dir=tmp_path
    )
    await rt.start()
    result = await rt.exec(["python3", "-c", CONNECT, str(host_port)], timeout=20)
    await rt.stop()
    assert result.stdout.strip() == "ok"


async def test_proxy_mode_reaches_only_the_unix_socket(tmp_path: Path, host_port: int) -> None:
    sock_path = tmp_path / "proxy.sock"

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"pong\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(answer, path=str(sock_path))
    sock_path.chmod(0o666)  # as the gateway's bridge makes it: a sandbox runs as another host user
    spec = RuntimeSpec(isolation=Isolation.BWRAP, network=NetworkMode.PROXY, proxy_socket=sock_path, proxy_port=18555)
    rt = LocalRuntime(spec, session_id="s3", base_dir=tmp_path / "rt")
    await rt.start()
    client = (
        "import os,socket,time\n"
        "for _ in range(50):\n"
        "    try:\n        s = socket.create_connection(('127.0.0.1', 18555)); break\n"
        "    except OSError:\n        time.sleep(0.1)\n"
        "s.sendall(b'ping\\n'); print(s.makefile().readline().strip(), os.environ['POLAR_PROXY_URL'])\n"
    )
    result = await rt.exec(["python3", "-c", client], timeout=30)
    blocked = await rt.exec(["python3", "-c", CONNECT, str(host_port)], timeout=20)
    await rt.stop()
    server.close()
    assert result.stdout.split() == ["pong", "http://127.0.0.1:18555"], result.stderr
    assert blocked.exit_code != 0


async def test_timeout_kills_the_whole_process_tree(runtime: LocalRuntime) -> None:
    # Both sleeps outlast the per-test timeout, so exec returning shows the timeout ended the command; the
    # background child, had it survived, would write ``late`` after 2 s.
    result = await runtime.exec(["sh", "-c", "(sleep 2; touch late) & sleep 100"], timeout=1.0)
    assert result.timed_out
    await asyncio.sleep(3)
    assert not (runtime.host_root / "late").exists()


async def test_cancel_kills_running_commands(runtime: LocalRuntime) -> None:
    task = asyncio.create_task(runtime.exec(["sleep", "100"], timeout=100))
    await asyncio.sleep(0.5)
    await runtime.cancel()
    with pytest.raises(RuntimeCancelled):
        await asyncio.wait_for(task, 10)
    with pytest.raises(RuntimeCancelled):
        await runtime.exec(["true"], timeout=5)


async def test_vanished_session_directory_is_runtime_died(runtime: LocalRuntime) -> None:
    if runtime.host_root.is_symlink():  # root: a link to the session's own file system, which goes first
        mount = str(runtime.host_root.readlink())
        await asyncio.to_thread(subprocess.run, ["umount", "-l", mount], check=True)
        runtime.host_root.unlink()
    else:
        shutil.rmtree(runtime.host_root)
    with pytest.raises(RuntimeDied):
        await runtime.exec(["true"], timeout=5)


def _mounted(path: Path) -> bool:
    """Whether ``path`` is (or links to) a mount point."""
    return os.path.ismount(os.path.realpath(path))


def _exists(path: Path) -> bool:
    return path.exists()


def _host_ids(pid: int) -> tuple[list[int], list[int]] | None:
    """The ``Uid:`` and ``Gid:`` lines of a host process (real, effective, saved, filesystem)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    ids = {line.split(":")[0]: [int(x) for x in line.split()[1:]] for line in lines if line[:4] in ("Uid:", "Gid:")}
    return ids["Uid"], ids["Gid"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the runtime started as root")
@pytest.mark.parametrize("network", [NetworkMode.NONE, NetworkMode.PROXY])
async def test_no_sandboxed_process_is_host_root(tmp_path: Path, network: NetworkMode) -> None:
    """Read from the host, while they run, every process of a root runtime's sandbox is an unprivileged id."""
    sock_path = tmp_path / "proxy.sock"
    server = await asyncio.start_unix_server(lambda r, w: w.close(), path=str(sock_path))
    spec = RuntimeSpec(isolation=Isolation.BWRAP, network=network, proxy_socket=sock_path, proxy_port=18556)
    rt = LocalRuntime(spec, session_id="ids", base_dir=tmp_path / "rt")
    await rt.start()
    try:
        command = asyncio.create_task(rt.exec(["sh", "-c", "sleep 30 & sleep 30; wait"], timeout=60))
        pids: list[int] = []
        for _ in range(100):  # until both sleeps run
            await asyncio.sleep(0.1)
            pids = [pid for group in rt._live_groups for pid in descendants(group)]
            names = process_names(pids)
            if names.count("sleep") == 2:
                break
        assert names.count("sleep") == 2, names
        if network is NetworkMode.PROXY:  # the session's one forwarder (runtimes._forwarder) too
            assert rt._forwarder is not None
            pids.append(rt._forwarder.pid)
        seen = {pid: _host_ids(pid) for pid in pids}
        ids = {pid: found for pid, found in seen.items() if found is not None}
        assert "bwrap" in names
        # A command that never calls the model starts no forwarder (one per session, outside the command).
        assert not [name for name in names if name.startswith("python")], names
        for uids, gids in ids.values():
            assert 0 not in uids
            assert 0 not in gids
        (uid,) = {uid for uids, _ in ids.values() for uid in uids}  # one host id for the whole sandbox
        assert uid >= 700_000_000
        # Its files are that id's: the sandbox can write them, nobody else's.
        assert (rt.host_root / "home").stat().st_uid == uid
        await rt.upload(b"x", "up/f.txt")
        assert (rt.host_root / "up" / "f.txt").stat().st_uid == uid
        assert (rt.host_root / "up").stat().st_uid == uid
        inside = await rt.exec(["sh", "-c", "id -u; echo y >> up/f.txt"], timeout=30)
        assert inside.ok, inside.stderr
        assert inside.stdout.split() == [str(spec.sandbox_uid)]
        command.cancel()
    finally:
        await rt.stop()
        server.close()


async def _forwarder_probe_as_a_user(*args: str) -> dict[str, Any]:
    with unprivileged_dir() as (user, directory):
        if not user:
            return await forwarder_probe.probe(directory, no_user_namespace=args == ("no-userns",))
        module = "integration_tests.support.forwarder_probe"
        returncode, stdout, stderr = await run_module_as(user, module, str(directory), *args)
        assert returncode == 0, stderr.decode()[-2000:]
        out: dict[str, Any] = json.loads(stdout)
        out["stderr"] = stderr.decode()
        return out


@pytest.mark.timeout(300)
async def test_an_ordinary_users_session_has_one_forwarder_in_a_namespace_of_its_own() -> None:
    """As an ordinary host user too, a ``proxy`` session's commands start no forwarder of their own: they join the
    session's network namespace, owned by a user namespace of the forwarder's, and reach the proxy through it;
    they keep the host user's ids and cannot take the shared loopback down; stop ends the forwarder."""
    out = await _forwarder_probe_as_a_user()
    assert out["host_uid"] != 0
    assert out["session_forwarder"], out
    names = out["command_processes"]
    assert names.count("sleep") == 2, names
    assert not [name for name in names if name.startswith("python")], names  # no forwarder in the command
    assert [(code, text) for code, text, _ in out["calls"]] == [(0, "proxy:hello")] * 2, out["calls"]
    assert out["ids_inside"] == [str(out["host_uid"]), str(out["host_gid"])]
    assert out["lo_down"][0] != 0
    assert "Operation not permitted" in out["lo_down"][1]
    assert out["calls_after_lo_down"] == "proxy:hello"
    assert not out["forwarder_left"]


@pytest.mark.timeout(300)
async def test_without_a_user_namespace_each_command_starts_its_own_forwarder() -> None:
    """Where an ordinary user cannot make the forwarder's user namespace, the session still reaches the proxy:
    each command then starts its own forwarder inside its sandbox, and the runtime says so."""
    out = await _forwarder_probe_as_a_user("no-userns")
    assert not out["session_forwarder"]
    assert [name for name in out["command_processes"] if name.startswith("python")], out["command_processes"]
    assert [(code, text) for code, text, _ in out["calls"]] == [(0, "proxy:hello")] * 2, out["calls"]
    assert "each command starts its own" in out.get("stderr", "each command starts its own")


@pytest.mark.skipif(os.geteuid() != 0, reason="a loop-mounted image needs root")
async def test_disk_quota_is_a_file_system_of_its_own(tmp_path: Path) -> None:
    """The write past the quota fails with ENOSPC and nothing lands past it; a sandbox left full has reached its
    quota (DiskQuotaExceeded); stop unmounts and deletes the image."""
    rt = LocalRuntime(RuntimeSpec(isolation=Isolation.BWRAP, disk_limit="64m"), session_id="q", base_dir=tmp_path)
    await rt.start()
    try:
        assert _mounted(rt.host_root)
        fill = "dd if=/dev/zero of=big bs=1M count=100; rc=$?; du -k big; rm big; exit $rc"
        refused = await rt.exec(["sh", "-c", fill], timeout=60)  # fills, is refused, frees: the session goes on
        assert refused.exit_code != 0
        assert "No space left on device" in refused.stderr
        assert int(refused.stdout.split()[0]) * 1024 <= 64 * 2**20
        with pytest.raises(DiskQuotaExceeded, match="filled its disk quota"):
            await rt.exec(["sh", "-c", "dd if=/dev/zero of=big bs=1M count=100"], timeout=60)
        os.sync()
        (image,) = (tmp_path / ".polar-disks").glob("*.img")
        assert image.stat().st_blocks * 512 <= 64 * 2**20
        assert (rt.host_root / "big").stat().st_blocks * 512 <= 64 * 2**20
        with pytest.raises(DiskQuotaExceeded):
            await rt.exec(["true"], timeout=30)
    finally:
        await rt.stop()
    assert not rt.host_root.exists()
    assert not (tmp_path / ".polar-disks").exists()  # the last image went with its directory


@pytest.mark.skipif(os.geteuid() != 0, reason="a loop-mounted image needs root")
async def test_a_quota_larger_than_the_free_disk_is_refused_at_start(tmp_path: Path) -> None:
    stat = os.statvfs(tmp_path)
    free = stat.f_bavail * stat.f_frsize
    rt = LocalRuntime(RuntimeSpec(isolation=Isolation.BWRAP, disk_limit=f"{free // 2**20 + 1024}m"), session_id="big",
                      base_dir=tmp_path)  # fmt: skip
    with pytest.raises(DiskSpaceUnavailable, match="larger than the free space"):
        await rt.start()
    assert not rt.host_root.exists()
    assert not (tmp_path / ".polar-disks").exists()  # the last image went with its directory


_CRASHING_OWNER = """
import asyncio, os, sys
from pathlib import Path
from runtimes import Isolation, NetworkMode, RuntimeSpec
from runtimes.local import LocalRuntime
spec = RuntimeSpec(isolation=Isolation.BWRAP, disk_limit="32m", network=NetworkMode.PROXY,
                   proxy_socket=Path(sys.argv[1]) / "proxy.sock")
rt = LocalRuntime(spec, session_id="crashed", base_dir=Path(sys.argv[1]))
import socket
socket.socket(socket.AF_UNIX).bind(str(spec.proxy_socket))
asyncio.run(rt.start())
print(rt.host_root, rt._forwarder.pid, flush=True)
os.kill(os.getpid(), 9)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a loop-mounted image needs root")
async def test_images_of_a_crashed_owner_are_swept_at_the_next_start(tmp_path: Path) -> None:
    repo = _REPO
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", _CRASHING_OWNER, str(tmp_path)], capture_output=True, text=True,
        cwd=repo, env={**os.environ, "PYTHONPATH": f"{repo}:{repo / 'gen'}"}, check=False,
    )  # fmt: skip
    left_text, forwarder_text = done.stdout.split()
    left = Path(left_text)
    assert left.name == "crashed", done.stderr
    assert _mounted(left)
    # The session's proxy forwarder does not outlive its owner (it watches a pipe the owner held).
    for _ in range(200):
        if not _exists(Path(f"/proc/{forwarder_text}")):
            break
        await asyncio.sleep(0.05)
    assert not _exists(Path(f"/proc/{forwarder_text}"))
    rt = LocalRuntime(RuntimeSpec(isolation=Isolation.BWRAP, disk_limit="32m"), session_id="next", base_dir=tmp_path)
    await rt.start()
    try:
        assert not _mounted(left)
        assert not _exists(left)
        assert [p.name for p in (tmp_path / ".polar-disks").glob("*.img")] == ["next.img"]
    finally:
        await rt.stop()
