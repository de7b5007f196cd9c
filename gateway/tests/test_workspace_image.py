"""``metadata.workspace_image_path``: admission checks, and the seed and base scripts run on this host.

The scripts are the ones a container runs (``sh``, GNU ``find``/``cp``, ``git``); here a small host runtime
runs them on a directory standing in for the image's, so the copy, the base and the patch against it are
checked without Docker (``integration_tests/test_swebench_workspace.py`` runs them in a container).
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from gateway.agent import HarnessAgentRunner
from gateway.harnesses.patch import collect_patch, init_workspace
from gateway.models import EvaluatorConfig, HarnessConfig, SessionSpec
from gateway.workspace import image_base, image_source, require_image, seed_argv, workspace_base
from polar_core.errors import FailedPrecondition, InvalidArgument
from polar_core.git_trees import TreeCache
from polar_core.testing import git
from runtimes import ExecResult, RuntimeKind, RuntimeSpec


def _spec(image_path: Any, **metadata: Any) -> SessionSpec:
    return SessionSpec(
        session_id="s",
        task_id="t",
        harness=HarnessConfig("command", {"argv": ["true"]}),
        metadata={"workspace_image_path": image_path, **metadata},
    )


@dataclasses.dataclass
class _HostRuntime:
    """Runs commands on this host below ``root`` (what the seed and base steps need of a runtime)."""

    root: PurePosixPath
    spec: RuntimeSpec | None = None

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: Any = None,
        env: Mapping[str, str] | None = None,
        timeout: float,  # noqa: ASYNC109 - the Runtime protocol's signature
    ) -> ExecResult:
        pipe = asyncio.subprocess.PIPE
        proc = await asyncio.create_subprocess_exec(*argv, stdout=pipe, stderr=pipe)
        out, err = await proc.communicate()
        return ExecResult(proc.returncode or 0, out.decode(), err.decode(), False, 0.0)

    async def download(self, src: PurePosixPath) -> bytes:
        return await asyncio.to_thread(Path(src).read_bytes)


def test_a_well_formed_path_is_normalised() -> None:
    assert image_source(_spec("/testbed/")) == "/testbed"
    assert image_source(_spec("")) == ""
    HarnessAgentRunner().validate(_spec("/testbed"))


@pytest.mark.parametrize("bad", [3, ["/testbed"], "testbed", "/testbed/../etc", "/", "//testbed", "/a\0b"])
def test_malformed_paths_are_refused_naming_the_field(bad: Any) -> None:
    with pytest.raises(InvalidArgument) as info:
        HarnessAgentRunner().validate(_spec(bad))
    assert info.value.details["field"] == "metadata.workspace_image_path"


def test_a_host_repository_or_base_commit_besides_it_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="cannot also name a host repository"):
        image_source(_spec("/testbed", repo=str(tmp_path)))
    spec = dataclasses.replace(_spec("/testbed"), evaluator=EvaluatorConfig("swe", {"base_commit": "main"}))
    with pytest.raises(InvalidArgument, match="cannot also name"):
        image_source(spec)


def test_it_needs_a_runtime_with_an_image_and_a_recorded_base(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="needs a runtime with an image"):
        require_image(_HostRuntime(PurePosixPath(tmp_path)), "/testbed")  # type: ignore[arg-type]
    with pytest.raises(FailedPrecondition, match="needs a runtime with an image"):
        require_image(_HostRuntime(PurePosixPath(tmp_path), RuntimeSpec()), "/testbed")  # type: ignore[arg-type]
    image = _HostRuntime(PurePosixPath("/polar/session"), RuntimeSpec(kind=RuntimeKind.DOCKER, image="img"))
    require_image(image, "/testbed")  # type: ignore[arg-type]
    for overlapping in ("/polar", "/polar/session", "/polar/session/workspace"):
        with pytest.raises(FailedPrecondition, match="overlaps the session directory"):
            require_image(image, overlapping)  # type: ignore[arg-type]
    # collect without the base prepare took must not fall back to the agent-controlled first commit
    with pytest.raises(FailedPrecondition, match="no record of it"):
        workspace_base(_spec("/testbed"), TreeCache(tmp_path / "trees"))


def _image_dir(root: Path) -> Path:
    """A stand-in for the image's ``/testbed``: a git repository with history, hidden files and a link."""
    testbed = root / "testbed"
    (testbed / "pkg").mkdir(parents=True)
    (testbed / "pkg" / "mod.py").write_text("X = 1\n")
    (testbed / ".hidden").write_text("h\n")
    (testbed / "run.sh").write_text("#!/bin/sh\n")
    (testbed / "run.sh").chmod(0o755)
    (testbed / "link").symlink_to("pkg/mod.py")
    git(testbed, "init", "-q")
    git(testbed, "add", "-A")
    git(testbed, "commit", "-qm", "one")
    (testbed / "future.txt").write_text("later\n")
    git(testbed, "add", "-A")
    git(testbed, "commit", "-qm", "two")
    git(testbed, "rm", "-q", "future.txt")
    git(testbed, "commit", "-qm", "three")
    return testbed


async def test_the_seeded_workspace_and_its_base_survive_a_rewritten_git(tmp_path: Path) -> None:
    testbed = _image_dir(tmp_path)
    session = tmp_path / "session"
    session.mkdir()
    workspace = session / "workspace"
    runtime = _HostRuntime(PurePosixPath(session))
    done = await runtime.exec(seed_argv(str(testbed), PurePosixPath(workspace)), timeout=60)
    assert done.ok, done.stderr
    assert sorted(p.name for p in workspace.iterdir()) == [".hidden", "link", "pkg", "run.sh"]  # no .git
    assert (workspace / "link").is_symlink()
    assert (workspace / "run.sh").stat().st_mode & 0o111
    init_workspace(workspace)
    trees = TreeCache(tmp_path / "trees")
    base = await image_base(runtime, PurePosixPath(workspace), trees)  # type: ignore[arg-type]
    assert base.pack is not None
    assert base.pack == trees.cached_pack(base.tree)
    assert not list((session / ".polar").iterdir())  # the pack made in the runtime is removed there
    again = await image_base(runtime, PurePosixPath(workspace), trees)  # type: ignore[arg-type]
    assert again == base  # the cached pack serves the next session of the same tree

    # The agent fixes the file, then makes its fixed tree the first and only commit.
    (workspace / "pkg" / "mod.py").write_text("X = 2\n")
    shutil.rmtree(workspace / ".git")
    git(workspace, "init", "-q")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-qm", "polar: initial workspace")
    patch = collect_patch(workspace, base.tree, base.pack)
    assert "-X = 1\n+X = 2\n" in patch
    assert ".hidden" not in patch
    assert "future.txt" not in patch


async def test_a_missing_image_directory_fails_the_seed(tmp_path: Path) -> None:
    runtime = _HostRuntime(PurePosixPath(tmp_path))
    done = await runtime.exec(seed_argv(str(tmp_path / "absent"), PurePosixPath(tmp_path / "ws")), timeout=60)
    assert done.exit_code == 1
    assert "is not a directory in the runtime's image" in done.stderr


def test_the_tree_cache_refuses_a_name_that_is_not_a_sha(tmp_path: Path) -> None:
    trees = TreeCache(tmp_path / "trees")
    for bad in ("../x", "HEAD", ""):
        with pytest.raises(InvalidArgument):
            trees.store_pack(bad, b"")
        with pytest.raises(InvalidArgument):
            trees.cached_pack(bad)
