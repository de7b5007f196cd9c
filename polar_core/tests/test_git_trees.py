"""Base trees of real git repositories: revisions checked, trees exported exactly, packs without history."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from polar_core.errors import InvalidArgument
from polar_core.git_trees import TreeCache, check_revision, is_git_repository
from polar_core.testing import BINARY, BUGGY, git, make_history_repo


@pytest.mark.parametrize("value", ["main", "v1.0", "feature/x-1", "a1b2c3d", "0" * 40, "release_2"])
def test_plain_refs_and_shas_are_accepted(value: str) -> None:
    assert check_revision(value) == value


@pytest.mark.parametrize(
    "value",
    ["--upload-pack=touch /tmp/x", "-x", "HEAD~1", "HEAD^", "a..b", "@{-1}", "main@{1}", "x.lock", "a//b", "", " x"],
)
def test_options_ranges_and_expressions_are_refused(value: str) -> None:
    with pytest.raises(InvalidArgument, match="hex commit sha or a plain ref"):
        check_revision(value)


def test_base_commit_resolves_exports_the_base_and_packs_no_history(tmp_path: Path) -> None:
    repo = make_history_repo(tmp_path / "repo")
    trees = TreeCache(tmp_path / "cache")
    resolved = trees.resolve(repo.path, repo.base)
    assert resolved.commit == repo.base
    out = trees.export(resolved)
    assert (out / "calc.py").read_text() == BUGGY
    assert (out / "data.bin").read_bytes() == BINARY
    assert (out / "run.sh").stat().st_mode & 0o111
    assert not (out / "README.md").exists()
    assert not (out / ".git").exists()
    assert trees.export(resolved) == out  # cached by tree
    pack = trees.pack(resolved)
    store = tmp_path / "store"
    git(tmp_path, "init", "-q", "--bare", str(store))
    with pack.open("rb") as data:
        subprocess.run(["git", "--git-dir", str(store), "index-pack", "--stdin"], stdin=data, check=True)
    objects = git(store, "cat-file", "--batch-all-objects", "--batch-check")
    assert " commit " not in objects
    assert repo.fix_blob not in objects
    assert resolved.tree in objects
    # Without base_commit a git repository means its HEAD.
    assert trees.resolve(repo.path).commit == repo.head


def test_export_ignores_attributes(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / ".gitattributes").write_text("skip.txt export-ignore\nsubst.txt export-subst\ncrlf.txt -text\n")
    (repo / "skip.txt").write_text("kept\n")
    (repo / "subst.txt").write_text("$Format:%H$\n")
    (repo / "crlf.txt").write_bytes(b"a\r\nb\r\n")
    (repo / "link").symlink_to("skip.txt")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    trees = TreeCache(tmp_path / "cache")
    out = trees.export(trees.resolve(repo, "HEAD"))
    assert (out / "skip.txt").read_text() == "kept\n"
    assert (out / "subst.txt").read_text() == "$Format:%H$\n"
    assert (out / "crlf.txt").read_bytes() == b"a\r\nb\r\n"
    assert (out / "link").is_symlink()
    assert str((out / "link").readlink()) == "skip.txt"


def test_unknown_commit_plain_directory_and_submodule_are_refused(tmp_path: Path) -> None:
    repo = make_history_repo(tmp_path / "repo")
    trees = TreeCache(tmp_path / "cache")
    with pytest.raises(InvalidArgument, match="is not a commit"):
        trees.resolve(repo.path, "f" * 40)
    with pytest.raises(InvalidArgument, match="is not a commit"):
        trees.resolve(repo.path, "no-such-branch")
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(InvalidArgument, match="needs a git repository"):
        trees.resolve(plain, repo.base)
    # A plain directory inside a repository is not that repository.
    inner = repo.path / "tests"
    assert not is_git_repository(inner)
    sub = tmp_path / "sub"
    make_history_repo(sub)
    git(repo.path, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "vendor/sub")
    git(repo.path, "commit", "-qm", "add a submodule")
    with pytest.raises(InvalidArgument, match="submodule at 'vendor/sub'"):
        trees.resolve(repo.path, "main")


def test_snapshot_of_a_plain_directory_respects_gitignore(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / ".gitignore").write_text("*.log\n")
    (plain / "a.txt").write_text("a\n")
    (plain / "x.log").write_text("noise\n")
    trees = TreeCache(tmp_path / "cache")
    snap = trees.snapshot(plain)
    listed = git(snap.repo, "ls-tree", "-r", "--name-only", snap.tree)
    assert listed.split() == [".gitignore", "a.txt"]
    assert trees.pack(snap).is_file()
