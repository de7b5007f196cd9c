"""The five service images of ``deploy/Dockerfile``, built offline and run.

A private dockerd (no network); as ``PYTHON_IMAGE`` the debootstrapped Debian bookworm base of the Docker runtime
tests (python3 with venv, git, bubblewrap, ca-certificates, so the targets' apt step has nothing to fetch); as
``NODE_IMAGE`` an image holding this host's node and npm; the wheels of ``requirements.lock`` downloaded on the host
into ``~/.cache/polar/wheelhouse`` (``PIP_OFFLINE=1``) and the host's npm cache, which ``scripts/setup_harnesses.sh``
filled (``NPM_OFFLINE=1``). Each image then serves on the host network with its default command.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import struct_pb2
from polar.common.v1 import status_pb2, task_pb2
from polar.evaluator.v1 import evaluator_service_pb2 as eval_pb
from polar.evaluator.v1 import evaluator_service_pb2_grpc as eval_grpc
from polar.gateway.v1 import gateway_service_pb2 as gw_pb
from polar.gateway.v1 import gateway_service_pb2_grpc as gw_grpc
from polar.proxy.v1 import model_proxy_service_pb2 as proxy_pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as proxy_grpc
from polar.reconstructor.v1 import reconstructor_service_pb2 as rec_pb
from polar.reconstructor.v1 import reconstructor_service_pb2_grpc as rec_grpc

from integration_tests.support.backends import free_ports
from integration_tests.support.docker import PrivateDockerd, ensure_python_image, start_private_dockerd
from integration_tests.support.evaluator import example_spec
from polar_client import RolloutClient, load_task
from polar_core.channels import open_channel
from polar_core.convert import completion_to_proto
from polar_core.records import TerminalStatus
from reconstructor import ReconstructionOptions, SessionOutcome, reconstruct_session
from reconstructor.synthetic import IM_END, SyntheticSpec, synthetic_session

# The first test includes the module's image builds (a few minutes on two cores; the base layer is shared).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache" / "polar"
TOKEN = "image-test-token"
TARGETS = ("rollout", "reconstructor", "proxy", "evaluator", "gateway")
NODE_IMAGE = "polar-test-node:host"
LABEL = "polar.test=deploy-images"


def _wheelhouse() -> Path:
    """The wheels of the lock and of deploy/requirements-nodeps.txt (plus pip and setuptools), downloaded on the
    host once per machine (pip's own cache makes a later call cheap)."""
    dest = CACHE / "wheelhouse"
    dest.mkdir(parents=True, exist_ok=True)
    download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "-d", str(dest)]
    for extra in (
        ["-r", str(REPO / "requirements.lock"), "pip>=24", "setuptools>=70"],
        # harbor declares Python >=3.12; its task modules run on the images' 3.11 (as scripts/setup.sh installs it).
        ["--ignore-requires-python", "-r", str(REPO / "deploy" / "requirements-nodeps.txt")],
    ):
        subprocess.run([*download, *extra], check=True, timeout=900, capture_output=True)
    return dest


def _npm_cache() -> Path | None:
    """The host's npm cache (``_cacache`` inside it), when npm is installed."""
    npm = shutil.which("npm")
    if npm is None:
        return None
    out = subprocess.run([npm, "config", "get", "cache"], capture_output=True, text=True, check=False).stdout.strip()
    return Path(out) if out and (Path(out) / "_cacache").is_dir() else None


def _node_image(client: Any, root: Path) -> str | None:
    """An image with this host's node at /usr/local/bin and npm under /usr/local/lib, like node:20's layout."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        return None
    npm_dir = Path(npm).resolve().parents[1]  # .../node_modules/npm/bin/npm-cli.js -> .../node_modules/npm
    tarball = root / "node.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(Path(node).resolve(), arcname="usr/local/bin/node")
        tar.add(npm_dir, arcname="usr/local/lib/node_modules/npm")
    repo, tag = NODE_IMAGE.split(":")
    with tarball.open("rb") as fh:
        client.api.import_image_from_data(fh, repository=repo, tag=tag)
    return NODE_IMAGE


def _link_tree(source: Path, dest: Path) -> None:
    """Hard-link (or copy) every file of ``source`` into ``dest``."""
    for path in source.rglob("*"):
        if path.is_file():
            target = dest / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except OSError:
                shutil.copy2(path, target)


def _context(root: Path, wheels: Path, npm_cache: Path) -> Path:
    """A build context as a clean checkout would give it, with the wheels and the npm cache added."""
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
    _link_tree(wheels, context / "deploy" / "wheels")
    _link_tree(npm_cache / "_cacache", context / "deploy" / "npm-cache" / "_cacache")
    # The API reads .dockerignore at the context root; BuildKit would read deploy/Dockerfile.dockerignore.
    shutil.copy2(REPO / "deploy" / "Dockerfile.dockerignore", context / ".dockerignore")
    return context


def _build(daemon: PrivateDockerd, context: Path, bases: dict[str, str], target: str) -> tuple[str, float]:
    import docker

    started = time.monotonic()
    client = docker.APIClient(base_url=daemon.url, timeout=1800)
    log: list[str] = []
    stream: Any = None
    try:
        stream = client.build(
            path=str(context), dockerfile="deploy/Dockerfile", target=target, tag=f"polar-{target}:test",
            buildargs={**bases, "PIP_OFFLINE": "1", "NPM_OFFLINE": "1"}, network_mode="none", rm=True, forcerm=True,
            decode=True,
        )  # fmt: skip
        for chunk in stream:
            if "error" in chunk:
                pytest.fail(f"building {target} failed: {chunk['error']}\n{''.join(log[-60:])}")
            log.append(str(chunk.get("stream", "")))
    finally:
        if stream is not None:
            stream.close()  # the build's response socket, left open when a failure stops reading it early
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
        root = tmp_path_factory.mktemp("image")
        npm_cache, node = _npm_cache(), _node_image(client, root)
        if npm_cache is None or node is None:
            pytest.skip("no node/npm with a filled cache here (scripts/setup.sh installs the harness CLIs)")
        context = _context(root, _wheelhouse(), npm_cache)
        tags: dict[str, str] = {}
        for target in TARGETS:
            tags[target], seconds = _build(daemon, context, {"PYTHON_IMAGE": base, "NODE_IMAGE": node}, target)
            print(f"built {target} in {seconds:.0f} s")
        yield daemon, client, tags
    finally:
        for container in client.containers.list(all=True, filters={"label": LABEL}):
            container.remove(force=True)
        client.close()
        daemon.stop()


def _serve(client: Any, image: str, env: dict[str, str], port: int, *, sandboxes: bool = False) -> Any:
    """Run an image's default command on the host network; return the container once its health check passes.

    With ``sandboxes``, the container gets what deploy/compose.yaml gives the gateway and the evaluator so that
    bubblewrap works inside: unconfined seccomp and AppArmor and an unmasked /proc (``systempaths=unconfined``,
    which the Python SDK spells as empty ``MaskedPaths``/``ReadonlyPaths``), and the examples folder, read-only
    at the same path, because the example tasks name their repositories by path.
    """
    api = client.api
    options: dict[str, Any] = {"network_mode": "host"}
    # The operator's task roots: the example tasks name their repositories by host path (mounted at that path).
    roots = json.dumps([str(REPO / "examples")])
    env = {**{f"POLAR_{svc}_TASK_ROOTS": roots for svc in ("ROLLOUT", "GATEWAY", "EVALUATOR")}, **env}
    if sandboxes:
        examples = str(REPO / "examples")
        options["binds"] = {examples: {"bind": examples, "mode": "ro"}}
        options["security_opt"] = ["seccomp=unconfined", "apparmor=unconfined"]
    host_config = api.create_host_config(**options)
    if sandboxes:
        host_config["MaskedPaths"], host_config["ReadonlyPaths"] = [], []
    created = api.create_container(image, environment=env, host_config=host_config,
                                   labels=dict([LABEL.split("=")]))  # fmt: skip
    api.start(created)
    container = client.containers.get(created["Id"])
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
    script = "id -u; polar serve --help | head -1; ls -d /wheels /npm-cache /opt/polar/build 2>/dev/null; true"
    for tag in tags.values():
        out = client.containers.run(tag, entrypoint=["sh", "-c", script], remove=True).decode().splitlines()
        assert out[0] == "10001"
        assert "usage" in out[1].lower()
        assert out[2:] == [], f"{tag} carries build leftovers: {out[2:]}"


async def test_rollout_image_serves_with_a_token_and_keeps_tasks_across_a_restart(images) -> None:
    _, client, tags = images
    (port,) = free_ports(1)
    env = {"POLAR_ROLLOUT_HOST": "127.0.0.1", "POLAR_ROLLOUT_PORT": str(port), "POLAR_ROLLOUT_AUTH_TOKEN": TOKEN,
           "POLAR_ROLLOUT_METRICS_PORT": "-1"}  # fmt: skip
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
           "POLAR_RECONSTRUCTOR_AUTH_TOKEN": TOKEN, "POLAR_RECONSTRUCTOR_METRICS_PORT": "-1"}  # fmt: skip
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
    grpc_port, http_port, metrics_port = free_ports(3)
    env = {
        "POLAR_PROXY_HOST": "127.0.0.1", "POLAR_PROXY_PORT": str(grpc_port), "POLAR_PROXY_AUTH_TOKEN": TOKEN,
        "POLAR_PROXY_HTTP_HOST": "127.0.0.1", "POLAR_PROXY_HTTP_PORT": str(http_port),
        "POLAR_PROXY_MODEL": "tiny", "POLAR_PROXY_BACKEND": "scripted",
        "POLAR_PROXY_BACKEND_OPTIONS": json.dumps({"turns": [{"text": "Hello from the image."}]}),
        "POLAR_PROXY_METRICS_HOST": "127.0.0.1", "POLAR_PROXY_METRICS_PORT": str(metrics_port),
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
            metrics = await http.get(f"http://127.0.0.1:{metrics_port}/metrics")
        listed = await stub.ListCompletions(proxy_pb.ListCompletionsRequest(session_id="s-image"))
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "Hello from the image."
    assert refused.status_code == 401
    assert refused.json()["error"]["type"]
    assert metrics.status_code == 200
    assert "polar_proxy_calls_total{" in metrics.text
    (record,) = listed.completions
    assert len(record.response_token_ids) == len(record.response_logprobs) > 0
    assert record.prompt_token_ids


async def test_evaluator_image_resolves_the_reference_fix(images) -> None:
    _, client, tags = images
    (port,) = free_ports(1)
    env = {"POLAR_EVALUATOR_HOST": "127.0.0.1", "POLAR_EVALUATOR_PORT": str(port), "POLAR_EVALUATOR_AUTH_TOKEN": TOKEN,
           "POLAR_EVALUATOR_METRICS_PORT": "-1"}  # fmt: skip
    container = _serve(client, tags["evaluator"], env, port, sandboxes=True)
    spec, fix = example_spec("paginate")
    options = struct_pb2.Struct()
    options.update({k: (str(v) if isinstance(v, Path) else v) for k, v in spec.options.items()})
    evaluator = task_pb2.EvaluatorSpec(strategy=spec.strategy, options=options)
    async with open_channel(f"127.0.0.1:{port}", auth_token=TOKEN) as channel:
        stub = eval_grpc.EvaluatorServiceStub(channel)
        prepared = await stub.Prepare(eval_pb.PrepareRequest(evaluator=evaluator, task_id="paginate", request_id="r"))
        artifacts = eval_pb.EvaluationArtifacts(patch_bytes=fix, agent_status=eval_pb.AGENT_STATUS_COMPLETED)
        result = await stub.Evaluate(eval_pb.EvaluateRequest(handle=prepared.handle, artifacts=artifacts), timeout=120)
        garbage = eval_pb.EvaluationArtifacts(patch_bytes=b"not a patch\n", agent_status=eval_pb.AGENT_STATUS_COMPLETED)
        prepared2 = await stub.Prepare(eval_pb.PrepareRequest(evaluator=evaluator, task_id="paginate", request_id="g"))
        invalid = await stub.Evaluate(eval_pb.EvaluateRequest(handle=prepared2.handle, artifacts=garbage), timeout=120)
    assert result.terminal_status == status_pb2.TERMINAL_STATUS_RESOLVED, result.error_message
    assert result.reward == 1.0
    assert result.test_outcomes
    assert all(t.outcome == eval_pb.TEST_OUTCOME_STATUS_PASSED for t in result.test_outcomes)
    assert invalid.terminal_status == status_pb2.TERMINAL_STATUS_INVALID_PATCH
    assert "without isolation" not in container.logs().decode(errors="replace")  # bubblewrap ran the tests


async def test_gateway_image_serves_and_carries_the_five_harness_clis(images) -> None:
    _, client, tags = images
    grpc_port, metrics_port = free_ports(2)
    env = {
        "POLAR_GATEWAY_HOST": "127.0.0.1", "POLAR_GATEWAY_PORT": str(grpc_port), "POLAR_GATEWAY_AUTH_TOKEN": TOKEN,
        "POLAR_GATEWAY_GATEWAY_ID": "gw-image", "POLAR_GATEWAY_MAX_SESSIONS": "3",
        "POLAR_GATEWAY_METRICS_HOST": "127.0.0.1", "POLAR_GATEWAY_METRICS_PORT": str(metrics_port),
    }  # fmt: skip
    container = _serve(client, tags["gateway"], env, grpc_port, sandboxes=True)
    async with open_channel(f"127.0.0.1:{grpc_port}", auth_token=TOKEN) as channel:
        capacity = await gw_grpc.GatewayServiceStub(channel).GetCapacity(gw_pb.GetCapacityRequest(), timeout=10)
    assert capacity.gateway_id == "gw-image"
    assert capacity.capacity == capacity.available == 3
    async with httpx.AsyncClient(timeout=10) as http:
        metrics = await http.get(f"http://127.0.0.1:{metrics_port}/metrics")
    assert metrics.status_code == 200
    for cli in ("claude", "codex", "qwen", "pi", "gemini"):
        run = container.exec_run([f"/opt/polar/.harnesses/node_modules/.bin/{cli}", "--version"],
                                 environment={"HOME": "/tmp"})  # fmt: skip
        assert run.exit_code == 0, (cli, run.output.decode(errors="replace")[-2000:])
        assert any(ch.isdigit() for ch in run.output.decode()), (cli, run.output)


async def test_the_five_images_run_a_task_together(images) -> None:
    """The Compose topology on one host: a real task through rollout → gateway (pi in its sandbox) → proxy →
    reconstructor → evaluator, every service in its own container."""
    _, client, tags = images
    rollout, gateway, proxy, proxy_http, reconstructor, evaluator = free_ports(6)
    _serve(client, tags["proxy"], {
        "POLAR_PROXY_HOST": "127.0.0.1", "POLAR_PROXY_PORT": str(proxy), "POLAR_PROXY_AUTH_TOKEN": TOKEN,
        "POLAR_PROXY_HTTP_HOST": "127.0.0.1", "POLAR_PROXY_HTTP_PORT": str(proxy_http),
        "POLAR_PROXY_MODEL": "tiny", "POLAR_PROXY_BACKEND": "scripted", "POLAR_PROXY_CONTEXT_LENGTH": "32768",
        "POLAR_PROXY_BACKEND_OPTIONS": json.dumps({"turns": [{"text": "I looked; nothing to change."}]}),
        "POLAR_PROXY_METRICS_PORT": "-1",
    }, proxy)  # fmt: skip
    _serve(client, tags["reconstructor"], {
        "POLAR_RECONSTRUCTOR_HOST": "127.0.0.1", "POLAR_RECONSTRUCTOR_PORT": str(reconstructor),
        "POLAR_RECONSTRUCTOR_AUTH_TOKEN": TOKEN, "POLAR_RECONSTRUCTOR_METRICS_PORT": "-1",
    }, reconstructor)  # fmt: skip
    _serve(client, tags["evaluator"], {
        "POLAR_EVALUATOR_HOST": "127.0.0.1", "POLAR_EVALUATOR_PORT": str(evaluator),
        "POLAR_EVALUATOR_AUTH_TOKEN": TOKEN, "POLAR_EVALUATOR_METRICS_PORT": "-1",
    }, evaluator, sandboxes=True)  # fmt: skip
    _serve(client, tags["gateway"], {
        "POLAR_GATEWAY_HOST": "127.0.0.1", "POLAR_GATEWAY_PORT": str(gateway), "POLAR_GATEWAY_AUTH_TOKEN": TOKEN,
        "POLAR_GATEWAY_GATEWAY_ID": "gw-image", "POLAR_GATEWAY_METRICS_PORT": "-1",
        "POLAR_GATEWAY_PROXY_ADDRESS": f"127.0.0.1:{proxy}",
        "POLAR_GATEWAY_RECONSTRUCTOR_ADDRESS": f"127.0.0.1:{reconstructor}",
        "POLAR_GATEWAY_EVALUATOR_ADDRESS": f"127.0.0.1:{evaluator}",
        "POLAR_GATEWAY_ROLLOUT_ADDRESS": f"127.0.0.1:{rollout}",
    }, gateway, sandboxes=True)  # fmt: skip
    _serve(client, tags["rollout"], {
        "POLAR_ROLLOUT_HOST": "127.0.0.1", "POLAR_ROLLOUT_PORT": str(rollout), "POLAR_ROLLOUT_AUTH_TOKEN": TOKEN,
        "POLAR_ROLLOUT_GATEWAY_ADDRESSES": json.dumps([f"127.0.0.1:{gateway}"]), "POLAR_ROLLOUT_METRICS_PORT": "-1",
    }, rollout)  # fmt: skip
    task = load_task(REPO / "examples" / "tasks" / "paginate" / "task.yaml")
    task.task_id, task.num_samples = "paginate-in-images", 2
    async with RolloutClient(f"127.0.0.1:{rollout}", token=TOKEN) as trainer:
        await trainer.submit(task)
        info = await asyncio.wait_for(trainer.wait(task.task_id, poll_s=0.5), timeout=300)
        reply = await trainer.get(task.task_id)
    logs = {c.image.tags[0]: c.logs().decode(errors="replace")[-3000:] for c in client.containers.list(
        filters={"label": LABEL})}  # fmt: skip
    assert info.sessions_done == 2, logs
    assert not [tag for tag, log in logs.items() if "without isolation" in log], logs  # bubblewrap everywhere
    assert len(reply.session_results) == 2
    for result in reply.session_results:
        # The scripted answer changes nothing, so the clean-runtime evaluation finds the bug still there.
        assert result.terminal_status == status_pb2.TERMINAL_STATUS_UNRESOLVED, (result.error_message, logs)
        assert result.gateway_id == "gw-image"
        assert result.statistics.completions >= 1
        assert result.traces
        assert any(any(trace.loss_mask) for trace in result.traces)
