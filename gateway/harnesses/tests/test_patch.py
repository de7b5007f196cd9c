from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from gateway.harnesses import collect_patch, init_workspace
from polar_core.errors import FailedPrecondition
from polar_core.git_trees import TreeCache
from polar_core.testing import FIXED, HistoryRepo, make_history_repo


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


# --- a base tree kept outside the workspace (a git repository with history at its base commit) ---


@dataclasses.dataclass
class _Base:
    repo: HistoryRepo
    export: Path
    tree: str
    pack: Path
    ws: Path


@pytest.fixture
def base(tmp_path: Path) -> _Base:
    repo = make_history_repo(tmp_path / "repo")
    trees = TreeCache(tmp_path / "cache")
    resolved = trees.resolve(repo.path, repo.base)
    export = trees.export(resolved)
    ws = tmp_path / "ws"
    shutil.copytree(export, ws, symlinks=True)
    init_workspace(ws)
    return _Base(repo, export, resolved.tree, trees.pack(resolved), ws)


def _agent(ws: Path, script: str) -> None:
    env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}
    home = ws.parent / "home"
    home.mkdir(exist_ok=True)
    subprocess.run(["sh", "-ec", script], cwd=ws, check=True, env={"PATH": "/usr/bin:/bin", "HOME": str(home), **env})


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts and p.suffix != ".log"
    }


def _applied(b: _Base, patch: str, dest: Path) -> dict[str, bytes]:
    shutil.copytree(b.export, dest, symlinks=True)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=dest, input=patch.encode(), check=True)
    return _files(dest)


def _collect(b: _Base) -> str:
    return collect_patch(b.ws, b.tree, b.pack)


def test_the_workspace_has_one_commit_and_no_history(base: _Base) -> None:
    log = subprocess.run(["git", "-C", str(base.ws), "log", "--all", "--format=%s"], capture_output=True, text=True)
    assert log.stdout.splitlines() == ["polar: initial workspace"]
    found = subprocess.run(["git", "-C", str(base.ws), "cat-file", "-e", base.repo.fix_blob], capture_output=True)
    assert found.returncode != 0
    assert _collect(base) == ""


def test_the_fix_committed_by_the_agent_is_exactly_the_reference_patch(base: _Base, tmp_path: Path) -> None:
    (base.ws / "calc.py").write_text(FIXED)
    _agent(base.ws, "git commit -qam fix")
    patch = _collect(base)
    assert patch == base.repo.fix_patch
    assert _applied(base, patch, tmp_path / "check") == _files(base.ws)


@pytest.mark.parametrize(
    "script",
    [
        # Commits, then resets hard to an earlier of its own states.
        "echo one > a.txt; git add -A; git commit -qm one; echo two > a.txt; git commit -qam two;"
        " git reset -q --hard HEAD~1",
        # Rewrites history: a new root commit on an orphan branch, the old branch deleted, objects pruned.
        "git checkout -q --orphan new; echo one > a.txt; git add -A; git commit -qm root;"
        " git branch -D -q main master 2>/dev/null || true; git gc -q --prune=now",
        # Deletes .git.
        "echo one > a.txt; git add -A; git commit -qm one; rm -rf .git",
        # Replaces .git with a gitfile to nowhere and sets a diff option in the user's config.
        "git config --global diff.noprefix true; echo one > a.txt; rm -rf .git; echo 'gitdir: /nonexistent' > .git",
    ],
    ids=["reset-hard", "rewritten-history", "deleted-git", "replaced-git"],
)
def test_whatever_the_agent_does_to_git_the_patch_is_its_change(base: _Base, tmp_path: Path, script: str) -> None:
    (base.ws / "calc.py").write_text(FIXED)
    _agent(base.ws, script)
    patch = _collect(base)
    assert ".git/" not in patch
    assert "+++ b/a.txt" in patch
    assert patch.count("diff --git") == 2
    assert _applied(base, patch, tmp_path / "check") == _files(base.ws)


def test_binary_files_untracked_files_and_gitignore(base: _Base, tmp_path: Path) -> None:
    (base.ws / "data.bin").write_bytes(b"\x00\xff" * 300)
    (base.ws / "new.bin").write_bytes(bytes(range(256)))
    (base.ws / "debug.log").write_text("ignored\n")
    (base.ws / "run.sh").unlink()
    patch = _collect(base)
    assert "GIT binary patch" in patch
    assert "debug.log" not in patch
    applied = _applied(base, patch, tmp_path / "check")
    assert applied == _files(base.ws)
    assert applied["new.bin"] == bytes(range(256))
    assert "run.sh" not in applied
