"""Real git repositories as workspaces, through the real gateway, proxy (scripted backend) and evaluator.

The task's repository has three commits; the second holds the fix. The task names the first as its
``base_commit``. The agent (the ``command`` harness: one chat call, then a shell script) checks that it sees one
commit only, that the fix's blob is not reachable, and that the host repository is not visible, then does what
its scenario says to git. Each session's patch (kept by the evaluator beside its log) is exactly the agent's
change against the base tree, and the ``swe`` verdict follows: the reference fix resolves, no change does not.
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from polar.common.v1 import session_pb2, status_pb2, task_pb2
from polar.gateway.v1 import gateway_service_pb2 as pb

from integration_tests.support.gateway_stack import Stack, gateway_stack, until_stage
from polar_core.testing import FIXED, HistoryRepo, make_history_repo

pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("python3") is None, reason="needs git")

AGENT = """
import json, os, subprocess, sys, urllib.request
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": os.environ["POLAR_MODEL"], "messages": [{"role": "user", "content": "go"}]}).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
)
urllib.request.urlopen(request, timeout=60).read()
subprocess.run(["sh", "-ec", sys.argv[1]], check=True)
"""

NEW_BINARY = b"\x00\x01\x02\xff\xfe"
_FIX = f"printf %s {shlex.quote(FIXED)} > calc.py"
_ID = "export GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@b GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@b"
SCENARIOS = {
    "fix-committed": f"{_FIX}; git add -A; git commit -qm fix",
    "no-change": "true",
    "commit-then-reset": (
        f"{_FIX}; git commit -qam fix; echo 'def add(a, b): return 0' > calc.py; git commit -qam break;"
        " git reset -q --hard HEAD~1"
    ),
    "commit-then-reset-to-base": f"{_FIX}; git commit -qam fix; git reset -q --hard HEAD~1",
    "deleted-git": f"{_FIX}; git commit -qam fix; rm -rf .git",
    "binary-added": f"{_FIX}; printf '\\000\\001\\002\\377\\376' > new.bin; printf '\\000' >> data.bin",
}


def _checks(repo: HistoryRepo) -> str:
    """Shell lines that exit 3 when the agent can see history, the fix, or the host repository."""
    return (
        f'[ "$(git log --all --format=%H | wc -l)" -eq 1 ] || exit 3; '
        f"if git cat-file -e {repo.fix_blob} 2>/dev/null; then exit 3; fi; "
        f"if [ -e {shlex.quote(str(repo.path))} ]; then exit 3; fi; "
        f"if [ -e README.md ]; then exit 3; fi"
    )


def _session(session_id: str, repo: HistoryRepo, script: str) -> session_pb2.SessionSpec:
    task = task_pb2.Task(
        task_id="git",
        instruction="Fix add().",
        timeout_seconds=60,
        harness=task_pb2.HarnessSpec(name="command"),
        runtime=task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_LOCAL),
        evaluator=task_pb2.EvaluatorSpec(strategy="swe"),
    )
    task.evaluator.options.update(
        {
            "repo": str(repo.path),
            "base_commit": repo.base,
            "fail_to_pass": ["tests/test_calc.py::test_add"],
            "pass_to_pass": ["tests/test_calc.py::test_zero"],
        }
    )
    full = f"{_ID}; {_checks(repo)}; {script}"
    task.harness.options.update({"argv": ["python3", "-c", AGENT, full]})
    return session_pb2.SessionSpec(session_id=session_id, task_id="git", task=task, attempt=1)


def _kept_patch(tmp_path: Path, session_id: str) -> bytes | None:
    """The patch the evaluator received for ``session_id`` (``None``: it received none)."""
    for log in (tmp_path / "evaluator").rglob("eval.log"):
        if f"session={session_id}" in log.read_text(errors="replace"):
            kept = log.parent / "agent.patch"
            return kept.read_bytes() if kept.exists() else None
    raise AssertionError(f"no evaluation of {session_id}")


def _apply_to_base(repo: HistoryRepo, patch: bytes, dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(repo.path), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", repo.base], check=True)
    subprocess.run(["git", "-C", str(dest), "apply", "-"], input=patch, check=True)
    return dest


@pytest.fixture
def repo(tmp_path: Path) -> HistoryRepo:
    return make_history_repo(tmp_path / "task-repo")


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with gateway_stack(tmp_path) as running:
        yield running


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("fix-committed", "resolved"),
        ("no-change", "unresolved"),
        ("commit-then-reset", "resolved"),
        ("commit-then-reset-to-base", "unresolved"),
        ("deleted-git", "resolved"),
        ("binary-added", "resolved"),
    ],
)
async def test_the_patch_is_the_agents_change_whatever_it_does_to_git(
    stack: Stack, repo: HistoryRepo, tmp_path: Path, scenario: str, expected: str
) -> None:
    spec = _session(scenario, repo, SCENARIOS[scenario])
    await stack.stub.StartSession(pb.StartSessionRequest(spec=spec))
    reply = await until_stage(stack.stub, scenario, status_pb2.SESSION_STAGE_DONE, limit_s=90)
    assert reply.result.status == expected, reply.result.error_message
    assert reply.result.statistics.completions == 1
    patch = await _read(tmp_path, scenario)
    if scenario in ("no-change", "commit-then-reset-to-base"):
        assert not patch
    elif scenario == "binary-added":
        assert patch is not None
        assert b"GIT binary patch" in patch
        applied = await asyncio.to_thread(_apply_to_base, repo, patch, tmp_path / "applied")
        assert (applied / "new.bin").read_bytes() == NEW_BINARY
        assert (applied / "data.bin").read_bytes() == (repo.path / "data.bin").read_bytes() + b"\x00"
        assert (applied / "calc.py").read_text() == FIXED
    else:
        assert patch is not None
        assert patch.decode() == repo.fix_patch


async def test_an_unknown_base_commit_is_refused_at_admission(stack: Stack, repo: HistoryRepo) -> None:
    for bad, reason in (("0" * 40, "is not a commit"), ("--output=/tmp/x", "plain ref name")):
        spec = _session("bad", repo, "true")
        spec.task.evaluator.options["base_commit"] = bad
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stack.stub.StartSession(pb.StartSessionRequest(spec=spec))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason in (caught.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stack.stub.GetSession(pb.GetSessionRequest(session_id="bad"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def _read(tmp_path: Path, session_id: str) -> bytes | None:
    return await asyncio.to_thread(_kept_patch, tmp_path, session_id)
