"""The Docker runtime against a private dockerd this module starts (skipped when dockerd is absent)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from integration_tests.support.docker import private_docker
from runtimes import NetworkMode, PathEscapesSession, RuntimeCancelled, RuntimeDied, RuntimeKind, RuntimeSpec
from runtimes.docker import LABEL_MANAGED, DockerRuntime, reap_orphaned_containers


@pytest.fixture(scope="module")
def docker_env():
    with private_docker() as env:
        yield env


def _managed(client: Any) -> list[Any]:
    return list(client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"}))


@pytest.fixture
async def runtime(docker_env):
    daemon, client, image = docker_env
    rt = DockerRuntime(RuntimeSpec(kind=RuntimeKind.DOCKER, image=image, docker_host=daemon.url), session_id="d1",
                       client=client)  # fmt: skip
    await rt.start()
    yield rt
    await rt.stop()


async def test_exec_upload_download_and_limits(runtime: DockerRuntime, docker_env, tmp_path: Path) -> None:
    _, client, _ = docker_env
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "a.txt").write_text("hi")
    await runtime.upload(tmp_path / "repo", "repo")
    result = await runtime.exec(["sh", "-c", 'cat a.txt; echo " $HOME"'], cwd="repo", timeout=30)
    assert result.stdout.strip() == f"hi {runtime.root}/home"
    await runtime.upload(b"data", "out/x.bin")
    assert await runtime.download("out/x.bin") == b"data"
    with pytest.raises(PathEscapesSession):
        await runtime.download("/etc/passwd")
    attrs = client.containers.get(runtime.container_id).attrs["HostConfig"]
    assert attrs["NetworkMode"] == "none"
    assert attrs["PidsLimit"] == 1024
    assert attrs["Memory"] == 4 * 1024**3


async def test_network_none(runtime: DockerRuntime) -> None:
    result = await runtime.exec(["python3", "-c", "import socket; print(len(socket.if_nameindex()))"], timeout=30)
    assert result.stdout.strip() == "1"  # loopback only


async def test_timeout_is_reported(runtime: DockerRuntime) -> None:
    result = await runtime.exec(["sh", "-c", "sleep 100 & sleep 100"], timeout=1.0)
    assert result.timed_out


async def test_cancel_removes_the_container_and_leaks_nothing(docker_env) -> None:
    _, client, image = docker_env
    rt = DockerRuntime(RuntimeSpec(kind=RuntimeKind.DOCKER, image=image), session_id="d2", client=client)
    await rt.start()
    task = asyncio.create_task(rt.exec(["sleep", "100"], timeout=100))
    await asyncio.sleep(1.0)
    await rt.cancel()
    with pytest.raises(RuntimeCancelled):
        await asyncio.wait_for(task, 30)
    assert not [c for c in _managed(client) if c.labels.get("polar.session") == "d2"]


async def test_killed_container_is_runtime_died(docker_env) -> None:
    _, client, image = docker_env
    rt = DockerRuntime(RuntimeSpec(kind=RuntimeKind.DOCKER, image=image), session_id="d3", client=client)
    await rt.start()
    client.containers.get(rt.container_id).kill()
    with pytest.raises(RuntimeDied):
        await rt.exec(["true"], timeout=10)
    await rt.stop()
    assert not [c for c in _managed(client) if c.labels.get("polar.session") == "d3"]


def test_reaper_removes_containers_of_dead_owners(docker_env) -> None:
    _, client, image = docker_env
    labels = {
        LABEL_MANAGED: "true",
        "polar.session": "orphan",
        "polar.owner_pid": "999999999",
        "polar.owner_host": socket.gethostname(),
    }
    client.containers.run(image, ["sleep", "infinity"], detach=True, labels=labels, network_mode="none")
    removed = reap_orphaned_containers(client)
    assert len(removed) == 1
    assert not [c for c in _managed(client) if c.labels.get("polar.session") == "orphan"]


def test_host_network_spec_is_explicit() -> None:
    spec = RuntimeSpec.from_mapping({"kind": "docker", "image": "x"})
    assert spec.network is NetworkMode.NONE
