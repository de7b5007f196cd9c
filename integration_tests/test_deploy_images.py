"""The service images of ``deploy/Dockerfile``, built offline and run.

A private dockerd (no network), the Debian bookworm base that the Docker runtime tests use (python3 with venv),
and the wheels of ``requirements.lock`` downloaded on the host into ``~/.cache/polar/wheelhouse``: the real
Dockerfile builds its ``rollout``, ``reconstructor`` and ``proxy`` targets with ``PIP_OFFLINE=1``, and each image
then serves on the host network. The ``gateway`` and ``evaluator`` targets need Docker Hub's node image and
Debian's mirror inside the build, which this machine's dockerd cannot reach, so they are not built here.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from polar.common.v1 import status_pb2
from polar.proxy.v1 import model_proxy_service_pb2 as proxy_pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as proxy_grpc
from polar.reconstructor.v1 import reconstructor_service_pb2 as rec_pb
from polar.reconstructor.v1 import reconstructor_service_pb2_grpc as rec_grpc

from model_proxy.backends.testing.launch import free_ports
from polar_client import RolloutClient, load_task
from polar_core.channels import open_channel
from polar_core.convert import completion_to_proto
from polar_core.records import TerminalStatus
from reconstructor import ReconstructionOptions, SessionOutcome, reconstruct_session
from reconstructor.synthetic import IM_END, SyntheticSpec, synthetic_session
from runtimes.docker_testing import PrivateDockerd, ensure_python_image, start_private_dockerd

# The first test includes the module's image builds (a few minutes on two cores; the base layer is shared).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache" / "polar"
TOKEN = "image-test-token"
TARGETS = ("rollout", "reconstructor", "proxy")
LABEL = "polar.test=deploy-images"


def _wheelhouse() -> Path:
    """The wheels of the lock (plus pip and setuptools), downloaded on the host once per machine."""
    dest = CACHE / "wheelhouse"
    dest.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "-d", str(dest),
            "-r", str(REPO / "requirements.lock"), "pip>=24", "setuptools>=70"]  # fmt: skip
    subprocess.run(argv, check=True, timeout=900, capture_output=True)
    return dest


def _context(root: Path, wheels: Path) -> Path:
    """A build context as a clean checkout would give it, with the wheels in ``deploy/wheels/``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    context = root / "context"
    for rel in filter(None, listed.split("\0")):
        source = REPO / rel
        if source.is_file():
            (context / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, context / rel)
    for wheel in wheels.glob("*.whl"):
        try:
            os.link(wheel, context / "deploy" / "wheels" / wheel.name)
        except OSError:
            shutil.copy2(wheel, context / "deploy" / "wheels" / wheel.name)
    # The API reads .dockerignore at the context root; BuildKit would read deploy/Dockerfile.dockerignore.
    shutil.copy2(REPO / "deploy" / "Dockerfile.dockerignore", context / ".dockerignore")
    return context


def _build(daemon: PrivateDockerd, context: Path, base: str, target: str) -> tuple[str, float]:
    import docker

    started = time.monotonic()
    client = docker.APIClient(base_url=daemon.url, timeout=1800)
    log: list[str] = []
    try:
        stream = client.build(
            path=str(context), dockerfile="deploy/Dockerfile", target=target, tag=f"polar-{target}:test",
            buildargs={"PYTHON_IMAGE": base, "PIP_OFFLINE": "1"}, network_mode="none", rm=True, forcerm=True,
            decode=True,
        )  # fmt: skip
        for chunk in stream:
            if "error" in chunk:
                pytest.fail(f"building {target} failed: {chunk['error']}\n{''.join(log[-60:])}")
            log.append(str(chunk.get("stream", "")))
    finally:
        client.close()
    return f"polar-{target}:test", time.monotonic() - started


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrivateDockerd, Any, dict[str, str]]]:
    daemon = start_private_dockerd()
    if daemon is None:
        pytest.skip("no dockerd here (scripts/setup.sh installs docker.io)")
    client = daemon.client()
    try:
        base = ensure_python_image(client, CACHE / "images")
        if base is None:
            pytest.skip("cannot build the Debian base image here (debootstrap)")
        context = _context(tmp_path_factory.mktemp("image"), _wheelhouse())
        tags: dict[str, str] = {}
        for target in TARGETS:
            tags[target], seconds = _build(daemon, context, base, target)
            print(f"built {target} in {seconds:.0f} s")
        yield daemon, client, tags
    finally:
        for container in client.containers.list(all=True, filters={"label": LABEL}):
            container.remove(force=True)
        client.close()
        daemon.stop()


def _serve(client: Any, image: str, env: dict[str, str], port: int) -> Any:
    """Run an image's default command on the host network; return the container once its health check passes."""
    container = client.containers.run(image, environment=env, network_mode="host", detach=True,
                                      labels=dict([LABEL.split("=")]))  # fmt: skip
    _wait_healthy(container, port)
    return container


def _wait_healthy(container: Any, port: int, timeout_s: float = 120.0) -> None:
    """Poll the image's own health-check script, as Compose and Kubernetes would."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        container.reload()
        if container.status == "exited":
            pytest.fail(f"{container.image.tags} exited:\n{container.logs().decode(errors='replace')[-4000:]}")
        probe = container.exec_run(["python", "/opt/polar/deploy/healthcheck.py", f"127.0.0.1:{port}"])
        if probe.exit_code == 0:
            return
        time.sleep(0.5)
    pytest.fail(f"{container.image.tags} not healthy:\n{container.logs().decode(errors='replace')[-4000:]}")


def test_images_run_as_an_unprivileged_user_with_the_project_installed(images) -> None:
    _, client, tags = images
    for tag in tags.values():
        out = client.containers.run(tag, entrypoint=["sh", "-c", "id -u; polar serve --help | head -1"], remove=True)
        uid, usage = out.decode().splitlines()[:2]
        assert uid == "10001"
        assert "usage" in usage.lower()


async def test_rollout_image_serves_with_a_token_and_keeps_tasks_across_a_restart(images) -> None:
    _, client, tags = images
    (port,) = free_ports(1)
    env = {"POLAR_ROLLOUT_HOST": "127.0.0.1", "POLAR_ROLLOUT_PORT": str(port), "POLAR_ROLLOUT_AUTH_TOKEN": TOKEN}
    container = _serve(client, tags["rollout"], env, port)
    target = f"127.0.0.1:{port}"
    task = load_task(REPO / "examples" / "tasks" / "paginate" / "task.yaml")
    task.task_id = "image-task"
    async with RolloutClient(target, token=TOKEN) as trainer:
        submitted = await trainer.submit(task)
        assert submitted.task_id == "image-task"
        assert not submitted.already_existed
    async with RolloutClient(target) as stranger:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stranger.get("image-task")
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    container.restart(timeout=20)  # SIGTERM, then the same container (and its SQLite file) starts again
    _wait_healthy(container, port)
    async with RolloutClient(target, token=TOKEN) as trainer:
        again = await trainer.get("image-task")
        assert again.task.task.task_id == "image-task"
        assert again.task.sessions_total == task.num_samples
        resubmitted = await trainer.submit(task)
        assert resubmitted.already_existed


async def test_reconstructor_image_reconstructs(images) -> None:
    _, client, tags = images
    (port,) = free_ports(1)
    env = {"POLAR_RECONSTRUCTOR_HOST": "127.0.0.1", "POLAR_RECONSTRUCTOR_PORT": str(port),
           "POLAR_RECONSTRUCTOR_AUTH_TOKEN": TOKEN}  # fmt: skip
    _serve(client, tags["reconstructor"], env, port)
    records = synthetic_session(random.Random(3), SyntheticSpec(turns=6), "s-image")
    request = rec_pb.ReconstructRequest(
        completions=rec_pb.CompletionList(completions=[completion_to_proto(r) for r in records]),
        end_of_turn_token_ids=[IM_END],
        task_id="t",
        reward=1.0,
        terminal_status=status_pb2.TERMINAL_STATUS_RESOLVED,
    )
    async with open_channel(f"127.0.0.1:{port}", auth_token=TOKEN) as channel:
        reply = await rec_grpc.ReconstructorServiceStub(channel).Reconstruct(request, timeout=60)
    expected = reconstruct_session(
        records,
        ReconstructionOptions(end_of_turn_ids=(IM_END,)),
        SessionOutcome(task_id="t", reward=1.0, status=TerminalStatus.RESOLVED),
    )
    assert len(reply.traces) == len(expected.traces) > 0
    for got, want in zip(reply.traces, expected.traces, strict=True):
        assert list(got.prompt_token_ids) == want.prompt_token_ids
        assert list(got.response_token_ids) == want.response_token_ids
        assert list(got.loss_mask) == want.loss_mask


async def test_proxy_image_answers_a_provider_call_and_records_it(images) -> None:
    _, client, tags = images
    grpc_port, http_port = free_ports(2)
    env = {
        "POLAR_PROXY_HOST": "127.0.0.1", "POLAR_PROXY_PORT": str(grpc_port), "POLAR_PROXY_AUTH_TOKEN": TOKEN,
        "POLAR_PROXY_HTTP_HOST": "127.0.0.1", "POLAR_PROXY_HTTP_PORT": str(http_port),
        "POLAR_PROXY_MODEL": "tiny", "POLAR_PROXY_BACKEND": "scripted",
        "POLAR_PROXY_BACKEND_OPTIONS": json.dumps({"turns": [{"text": "Hello from the image."}]}),
    }  # fmt: skip
    _serve(client, tags["proxy"], env, grpc_port)
    async with open_channel(f"127.0.0.1:{grpc_port}", auth_token=TOKEN) as channel:
        stub = proxy_grpc.ModelProxyServiceStub(channel)
        opened = await stub.OpenSession(proxy_pb.OpenSessionRequest(session_id="s-image", model="policy"))
        async with httpx.AsyncClient(timeout=60) as http:
            reply = await http.post(
                f"http://127.0.0.1:{http_port}/v1/chat/completions",
                headers={"authorization": f"Bearer {opened.session_token}"},
                json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
            )
            refused = await http.post(
                f"http://127.0.0.1:{http_port}/v1/chat/completions",
                headers={"authorization": "Bearer not-a-session"},
                json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
            )
        listed = await stub.ListCompletions(proxy_pb.ListCompletionsRequest(session_id="s-image"))
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "Hello from the image."
    assert refused.status_code == 401
    assert refused.json()["error"]["type"]
    (record,) = listed.completions
    assert len(record.response_token_ids) == len(record.response_logprobs) > 0
    assert record.prompt_token_ids
