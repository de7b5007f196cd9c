"""Docker runtimes of one session id never collide, on a private dockerd this module starts.

Two ``polar run``s of the same SWE-bench record on one Docker host, a session's retried attempt, and the
evaluator's clean runtime beside the gateway's all create a runtime for the same session id; each must get a
container of its own (no ``409 Conflict``), be found by its labels, and be removed by its own ``stop`` only.
"""

from __future__ import annotations

import asyncio
import io
import re
import shutil
import subprocess
import tarfile
from typing import Any

import pytest

from integration_tests.support.docker import start_private_dockerd
from runtimes import RuntimeKind, RuntimeSpec
from runtimes.docker import LABEL_MANAGED, LABEL_SESSION, DockerRuntime

SESSION = "astropy__astropy-12907~attempt2/x:0000"  # characters Docker refuses in a name, on purpose


_TOOLS = ("sh", "sleep", "timeout", "mkdir", "true", "cat", "du")  # what the runtime runs in a container


def _host_tools_image(client: Any) -> str:
    """An image of this host's own ``sh`` and coreutils (with their libraries): all a session container needs
    here, built offline in a second (the Python test image may need a network to build)."""
    paths: set[str] = set()
    for tool in _TOOLS:
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"{tool} is not installed")
        paths.add(found)
        libraries = subprocess.run(["ldd", found], capture_output=True, text=True, check=False).stdout
        paths.update(re.findall(r"(/\S+) \(0x", libraries))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", dereference=True) as tar:
        for path in sorted(paths):
            tar.add(path, arcname=path.lstrip("/"))
        for folder in ("tmp", "polar"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)
    client.api.import_image_from_data(buffer.getvalue(), repository="polar-test-host-tools", tag="latest")
    return "polar-test-host-tools:latest"


@pytest.fixture(scope="module")
def docker_env():
    daemon = start_private_dockerd()
    if daemon is None:
        pytest.skip("dockerd is not installed (or this is not root)")
    client = daemon.client()
    try:
        yield daemon, client, _host_tools_image(client)
    finally:
        client.close()
        daemon.stop()


def _of_session(client: Any, session_id: str) -> list[Any]:
    found = client.containers.list(
        all=True, filters={"label": [f"{LABEL_MANAGED}=true", f"{LABEL_SESSION}={session_id}"]}
    )
    return list(found)


async def test_runtimes_of_one_session_get_containers_of_their_own(docker_env) -> None:
    daemon, client, image = docker_env
    spec = RuntimeSpec(kind=RuntimeKind.DOCKER, image=image, docker_host=daemon.url)
    first, second = (DockerRuntime(spec, session_id=SESSION, client=client) for _ in range(2))
    third = DockerRuntime(spec, session_id=SESSION, client=client)
    try:
        # Two at once (two runs on one host), then a third while they live (a retried attempt).
        await asyncio.gather(first.start(), second.start())
        await third.start()
        runtimes = (first, second, third)
        names = {rt.container_name for rt in runtimes}
        assert len(names) == 3
        for rt in runtimes:
            assert re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", rt.container_name)
            assert rt.container_name.startswith("polar-astropy__astropy-12907_attempt2_x_0000-")
            result = await rt.exec(["sh", "-c", "echo ok"], timeout=30)
            assert result.stdout.strip() == "ok"
        # Found by label, not by name: every one carries the session id as it is.
        assert {c.name for c in _of_session(client, SESSION)} == names
        assert {c.id for c in _of_session(client, SESSION)} == {rt.container_id for rt in runtimes}

        await second.stop()  # each stop removes its own container only
        assert {c.name for c in _of_session(client, SESSION)} == {first.container_name, third.container_name}
        assert (await first.exec(["true"], timeout=30)).ok
    finally:
        await asyncio.gather(first.stop(), second.stop(), third.stop())
    assert _of_session(client, SESSION) == []


async def test_the_same_session_runs_again_after_its_container_is_left_behind(docker_env) -> None:
    """A run that died without cleanup leaves its container; the next run of the record still starts."""
    daemon, client, image = docker_env
    spec = RuntimeSpec(kind=RuntimeKind.DOCKER, image=image, docker_host=daemon.url)
    crashed = DockerRuntime(spec, session_id="swe-0000", client=client)
    await crashed.start()  # never stopped by its owner
    again = DockerRuntime(spec, session_id="swe-0000", client=client)
    try:
        await again.start()
        assert (await again.exec(["true"], timeout=30)).ok
        assert len(_of_session(client, "swe-0000")) == 2
    finally:
        await again.stop()
        assert [c.name for c in _of_session(client, "swe-0000")] == [crashed.container_name]
        await crashed.stop()
    assert _of_session(client, "swe-0000") == []
