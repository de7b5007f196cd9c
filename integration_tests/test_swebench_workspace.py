"""The agent side of a SWE-bench instance in its image: the workspace seeded from ``/testbed``, end to end.

A real gateway, model proxy (scripted backend), reconstructor and evaluator (``gateway_stack``), every runtime
a container of a SWE-bench-style image built here (``toml`` with a planted bug at ``/testbed``, see
:mod:`integration_tests.support.swebench`) on a private dockerd. The task is the record's own mapping
(``metadata.workspace_image_path: /testbed``). The agent (the ``command`` harness: one chat call, then a shell
script) checks that its workspace holds the image's repository without the image's history, applies the
reference patch, and then attacks the base: it rewrites ``.git`` so that its first commit holds the fix. The
patch is still the agent's change against the base the gateway took before the agent ran, and the evaluator
grades it ``resolved`` in a clean container of the same image; an agent that changes nothing is ``unresolved``.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from polar.common.v1 import session_pb2, status_pb2, task_pb2
from polar.gateway.v1 import gateway_service_pb2 as pb

from integration_tests.support.docker import private_docker
from integration_tests.support.gateway_stack import Stack, gateway_stack, until_stage
from integration_tests.support.swebench import EDITABLE_IMAGE_TAG, IMAGE_TAG, build_image, make_instance
from integration_tests.test_git_workspaces import AGENT
from polar_client.formats.swebench import record_to_mapping

_ID = "export GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@b GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@b"
# The image's /testbed has its own history (two commits would show); the workspace must hold one commit only,
# and the repository's files.
_CHECKS = (
    '[ "$(git log --all --format=%H | wc -l)" -eq 1 ] || exit 3; '
    "[ -f src/toml/encoder.py ] && [ -f tests/test_basic.py ] || exit 4; "
    "grep -q 'bool: lambda v: unicode(v),' src/toml/encoder.py || exit 5"
)
# After the fix: a fresh .git whose only commit holds the fixed tree, so "the first commit" would show no change.
_REWRITE_GIT = "rm -rf .git; git init -q; git add -A; git commit -qm 'polar: initial workspace'"
# The interpreters of the editable image with the repository installed: the system Python, a venv of it.
_PYTHONS = ("python3", "/opt/venv/bin/python")


@pytest.fixture(scope="module")
def docker_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict[str, Any], dict[str, Any]]]:
    repo, record = make_instance(tmp_path_factory.mktemp("swebench-ws"))  # the image's python3 runs the tests
    # A later commit on another branch of the image's repository (HEAD stays at base_commit): history the
    # agent must not see.
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "checkout", "-q", "-b", "future"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "the future"], check=True)
    subprocess.run([*git, "checkout", "-q", "main"], check=True)
    editable_repo, editable_record = make_instance(tmp_path_factory.mktemp("swebench-ws-e"), editable=True)
    with private_docker() as (daemon, client, base):
        build_image(client, base, repo)
        build_image(client, base, editable_repo, editable=True)
        yield daemon, record, editable_record


@pytest.fixture
async def stack(
    tmp_path: Path, docker_env: tuple[Any, dict[str, Any], dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Stack]:
    daemon = docker_env[0]
    monkeypatch.setenv("DOCKER_HOST", daemon.url)  # the gateway's and the evaluator's runtimes
    monkeypatch.setenv("POLAR_EVALUATOR_ALLOWED_IMAGES", f'["{IMAGE_TAG}", "{EDITABLE_IMAGE_TAG}"]')
    images = [IMAGE_TAG, EDITABLE_IMAGE_TAG]
    async with gateway_stack(tmp_path, default_runtime="docker", allowed_images=images) as running:
        yield running


def _session(session_id: str, record: dict[str, Any], script: str) -> session_pb2.SessionSpec:
    mapping = record_to_mapping(record)
    assert mapping["metadata"]["workspace_image_path"] == "/testbed"
    evaluator = dict(mapping["evaluator"])
    task = task_pb2.Task(
        task_id=mapping["task_id"],
        instruction=mapping["instruction"],
        timeout_seconds=120,
        harness=task_pb2.HarnessSpec(name="command"),
        runtime=task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_DOCKER, image=mapping["runtime"]["image"]),
        evaluator=task_pb2.EvaluatorSpec(strategy=evaluator.pop("strategy")),
    )
    task.evaluator.options.update(evaluator)
    task.metadata.update(mapping["metadata"])
    task.harness.options.update({"argv": ["python3", "-c", AGENT, f"{_ID}; {_CHECKS}; {script}"]})
    return session_pb2.SessionSpec(session_id=session_id, task_id=task.task_id, task=task, attempt=1)


def _kept_patch(tmp_path: Path, session_id: str) -> bytes | None:
    for log in (tmp_path / "evaluator").rglob("eval.log"):
        if f"session={session_id}" in log.read_text(errors="replace"):
            kept = log.parent / "agent.patch"
            return kept.read_bytes() if kept.exists() else None
    raise AssertionError(f"no evaluation of {session_id}")


async def _finish(stack: Stack, spec: session_pb2.SessionSpec) -> Any:
    await stack.stub.StartSession(pb.StartSessionRequest(spec=spec))
    return await until_stage(stack.stub, spec.session_id, status_pb2.SESSION_STAGE_DONE, limit_s=240)


@pytest.mark.slow
async def test_the_agent_works_in_the_images_testbed(
    stack: Stack, docker_env: tuple[Any, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    record = docker_env[1]
    fix = f"printf %s {shlex.quote(record['patch'])} | git apply; {_REWRITE_GIT}"
    reply = await _finish(stack, _session("fixed", record, fix))
    assert reply.result.status == "resolved", reply.result.error_message
    assert reply.result.reward == 1.0
    assert reply.result.statistics.completions == 1
    patch = _kept_patch(tmp_path, "fixed")
    assert patch is not None
    assert patch.decode() == record["patch"]  # the agent's change only: no .git, nothing else of /testbed

    reply = await _finish(stack, _session("idle", record, "true"))
    assert reply.result.status == "unresolved", reply.result.error_message
    assert not _kept_patch(tmp_path, "idle")


async def test_a_malformed_workspace_image_path_is_refused_at_admission(
    stack: Stack, docker_env: tuple[Any, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    record = docker_env[1]
    for bad in ("testbed", "/testbed/../etc", "/"):
        spec = _session("bad", record, "true")
        spec.task.metadata["workspace_image_path"] = bad
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stack.stub.StartSession(pb.StartSessionRequest(spec=spec))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "workspace_image_path" in (caught.value.details() or "")
    spec = _session("bad", record, "true")
    spec.task.metadata["repo"] = str(tmp_path)
    with pytest.raises(grpc.aio.AioRpcError) as both:
        await stack.stub.StartSession(pb.StartSessionRequest(spec=spec))
    assert both.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot also name a host repository" in (both.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stack.stub.GetSession(pb.GetSessionRequest(session_id="bad"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.slow
async def test_the_images_editable_install_imports_the_agents_workspace(
    stack: Stack, docker_env: tuple[Any, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    """The image has ``/testbed`` installed editable (``src/`` layout) into a venv with system site packages
    (``/opt/venv``) and into its system Python: in the agent's workspace both (and so the agent's own test runs)
    import the workspace's copy, which the agent edits, not the image's ``/testbed``; graded resolved."""
    record = docker_env[2]
    where = "; ".join(f"{py} -c 'import toml; print(toml.__file__)' >> imported.txt" for py in _PYTHONS)
    fix = f"printf %s {shlex.quote(record['patch'])} | git apply; {where}"
    reply = await _finish(stack, _session("editable", record, fix))
    assert reply.result.status == "resolved", reply.result.error_message
    patch = _kept_patch(tmp_path, "editable")
    assert patch is not None
    imported = [line[1:] for line in patch.decode().splitlines() if line.startswith("+/")]
    assert len(imported) == len(_PYTHONS), patch.decode()
    for path in imported:
        assert path.endswith("/workspace/src/toml/__init__.py"), path  # not /testbed/src/...
