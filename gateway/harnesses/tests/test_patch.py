from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gateway.harnesses import collect_patch, init_workspace
from polar_core.errors import FailedPrecondition


def test_patch_contains_modified_new_and_deleted_files(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep.txt").write_text("one\n")
    (ws / "gone.txt").write_text("bye\n")
    sha = init_workspace(ws)
    assert len(sha) == 40
    assert collect_patch(ws) == ""

    (ws / "keep.txt").write_text("one\ntwo\n")
    (ws / "gone.txt").unlink()
    (ws / "new.txt").write_text("hello\n")
    patch = collect_patch(ws)
    assert "+two" in patch
    assert "deleted file mode" in patch
    assert "new file mode" in patch
    assert "+hello" in patch
    # The agent's own index is untouched: nothing got staged.
    staged = subprocess.run(["git", "-C", str(ws), "diff", "--cached", "--name-only"], capture_output=True, text=True)
    assert staged.stdout == ""


def test_patch_is_against_the_initial_commit_even_after_agent_commits(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    init_workspace(ws)
    (ws / "a.txt").write_text("b\n")
    git = ["git", "-C", str(ws), "-c", "user.name=a", "-c", "user.email=a@b"]
    subprocess.run([*git, "commit", "-qam", "agent"], check=True)
    assert "+b" in collect_patch(ws)


def test_patch_of_a_non_repository_fails(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition):
        collect_patch(tmp_path)
