"""The local runtime with real bubblewrap: isolation of files, environment and network; timeouts; cancel."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from pathlib import Path

import pytest

from runtimes import Isolation, NetworkMode, PathEscapesSession, RuntimeCancelled, RuntimeDied, RuntimeSpec
from runtimes.local import LocalRuntime

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
    shutil.rmtree(runtime.host_root)
    with pytest.raises(RuntimeDied):
        await runtime.exec(["true"], timeout=5)
