"""A task's repository as one tree without its history: resolve ``base_commit``, export it, pack it.

A task names its repository with ``repo`` and, when that is a git repository, optionally a ``base_commit``
(without one, a git repository means its ``HEAD``; a plain directory is used as it is). The gateway gives the
agent the tree of that commit (exported blob by blob, so neither the history, nor ``export-ignore`` /
``export-subst`` / eol attributes, nor filters change it) and diffs the agent's work against the same tree;
the evaluator applies the patch to the same export.

Both come from the task, so they are hostile input: the repository must be an absolute path holding a ``.git``
(discovery never climbs above it), ``base_commit`` must be a hex sha or a plain ref name (never an option, a
range or a reflog expression), git runs without the user's and the system's configuration, with hooks and
fsmonitor off, and only plumbing that does not touch the repository's work tree. Trees that hold submodules
(gitlinks) or paths git itself would refuse (``..``, ``.git``) are refused with ``InvalidArgument``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from polar_core.errors import FailedPrecondition, InvalidArgument

__all__ = [
    "EMPTY_TREE",
    "ResolvedTree",
    "TreeCache",
    "check_revision",
    "is_git_repository",
]

# The empty tree's sha-1 (git knows it without storing it).
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"

_HEX = re.compile(r"[0-9a-f]{4,64}")
# A plain ref name: letters, digits and ._/- ; no leading '-' or '.', no '..', no '@{', no '.lock' ending.
_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/-]{0,254}")
_SAFE = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "safe.directory=*")
_GITLINK = "160000"
_MODES = {"100644": 0o644, "100755": 0o755}


def check_revision(value: str) -> str:
    """Return ``value`` when it is a hex sha or a plain ref name.

    Raises:
        InvalidArgument: Anything else (options, ranges, ``@{...}``, ``~``/``^`` expressions, ``..``).
    """
    ok = bool(_HEX.fullmatch(value)) or (
        bool(_REF.fullmatch(value))
        and ".." not in value
        and "//" not in value
        and not value.endswith((".lock", "/", "."))
        and "/." not in value
    )
    if not ok:
        raise InvalidArgument(
            f"base_commit {value!r} must be a hex commit sha or a plain ref name (branch or tag)",
            details={"base_commit": value},
        )
    return value


def is_git_repository(path: Path) -> bool:
    """Whether ``path`` is the top of a git work tree (holds ``.git``, a directory or a gitfile)."""
    return path.is_dir() and os.path.lexists(path / ".git")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", GIT_TERMINAL_PROMPT="0")
    return env


def _git(repo: Path, args: Sequence[str], *, stdin: bytes | None = None, what: str) -> bytes:
    """Run plumbing in ``repo`` (never above it); raise ``FailedPrecondition`` with git's stderr on failure."""
    env = _env()
    # Discovery stops at the repository: a path inside another repository never reaches that one.
    env["GIT_CEILING_DIRECTORIES"] = str(repo.parent)
    done = subprocess.run(
        ["git", "-C", str(repo), *_SAFE, *args], input=stdin, capture_output=True, env=env, check=False
    )
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip()[-500:]
        raise FailedPrecondition(f"{what} failed (exit {done.returncode}): {detail}", details={"repo": str(repo)})
    return done.stdout


@dataclasses.dataclass(frozen=True, slots=True)
class ResolvedTree:
    """A repository's commit and its tree.

    Attributes:
        repo: The repository (host path).
        commit: The commit's full sha (empty for a plain directory).
        tree: The tree's full sha.
    """

    repo: Path
    commit: str
    tree: str


def _resolve(repo: Path, revision: str) -> ResolvedTree:
    rev = check_revision(revision)
    shas = []
    try:
        for spec in (f"{rev}^{{commit}}", f"{rev}^{{commit}}^{{tree}}"):
            out = _git(repo, ["rev-parse", "--verify", "--quiet", "--end-of-options", spec], what="resolving")
            shas.append(out.decode().strip())
    except FailedPrecondition:
        raise InvalidArgument(
            f"base_commit {rev!r} is not a commit of the task's repository {repo}",
            details={"repo": str(repo), "base_commit": rev},
        ) from None
    commit, tree = shas
    return ResolvedTree(repo, commit, tree)


def _entries(repo: Path, tree: str) -> list[tuple[str, str, str]]:
    """``(mode, sha, path)`` of every blob and gitlink in ``tree``, checked."""
    out = _git(repo, ["ls-tree", "-r", "-z", "--full-tree", tree], what="listing the base tree")
    entries: list[tuple[str, str, str]] = []
    for record in out.decode("utf-8", "surrogateescape").split("\0"):
        if not record:
            continue
        meta, _, path = record.partition("\t")
        mode, _kind, sha = meta.split()
        parts = path.split("/")
        if any(p in ("", ".", "..") or p.lower() == ".git" for p in parts):
            raise InvalidArgument(f"the task's repository tree holds an unsafe path {path!r}", details={"path": path})
        if mode == _GITLINK:
            raise InvalidArgument(
                f"the task's repository has a submodule at {path!r} in its base commit; submodules are not "
                "supported: vendor the submodule's files into the repository or use a plain directory",
                details={"repo": str(repo), "path": path},
            )
        entries.append((mode, sha, path))
    return entries


def _export(repo: Path, tree: str, dest: Path) -> None:
    """Write ``tree``'s blobs below ``dest`` (an empty directory) exactly as stored: no filters, no attributes."""
    entries = _entries(repo, tree)
    root = dest.resolve()
    env = _env()
    env["GIT_CEILING_DIRECTORIES"] = str(repo.parent)
    proc = subprocess.Popen(
        ["git", "-C", str(repo), *_SAFE, "cat-file", "--batch"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    feeder = threading.Thread(target=_feed, args=(proc.stdin, [sha for _, sha, _ in entries]), daemon=True)
    feeder.start()
    try:
        for mode, _sha, path in entries:
            header = proc.stdout.readline().split()
            if len(header) != 3:
                raise FailedPrecondition(f"cannot read {path!r} from the task's repository {repo}")
            data = proc.stdout.read(int(header[2]))
            proc.stdout.read(1)
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.parent.resolve() != root / os.path.dirname(path) or os.path.lexists(target):
                raise InvalidArgument(f"the task's repository tree holds a path through a link: {path!r}")
            if mode == "120000":
                os.symlink(os.fsdecode(data), target)
            else:
                target.write_bytes(data)
                target.chmod(_MODES.get(mode, 0o644))
    finally:
        feeder.join()
        proc.stdout.close()
        proc.wait()


def _feed(pipe: IO[bytes], shas: list[str]) -> None:
    with contextlib.suppress(BrokenPipeError):
        pipe.write("".join(f"{s}\n" for s in shas).encode())
        pipe.close()


def _publish(staging: Path, final: Path) -> None:
    """Rename ``staging`` to ``final`` unless another thread or process got there first (its copy is the same)."""
    try:
        staging.rename(final)
    except OSError:
        if not final.is_dir():
            raise


class TreeCache:
    """Exports and packs of base trees, content-addressed by tree sha below one private directory.

    Args:
        root: The cache directory (created ``0700``); by default one per user below the temporary directory.
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else Path(tempfile.gettempdir()) / f"polar-trees-{os.getuid()}"
        # Full shas name the same commit forever, so admission checks them once (git runs on the caller's thread).
        self._by_sha: dict[tuple[Path, str], ResolvedTree] = {}

    def _dir(self) -> Path:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(self.root)
        if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise FailedPrecondition(f"the tree cache {self.root} must be a private directory of this user")
        return self.root

    def resolve(self, repo: Path, base_commit: str = "") -> ResolvedTree:
        """The commit and tree ``base_commit`` (default ``HEAD``) names, checked for submodules and unsafe paths.

        Raises:
            InvalidArgument: Not a git repository, an unknown or malformed ``base_commit``, a submodule.
        """
        if not is_git_repository(repo):
            raise InvalidArgument(
                f"base_commit needs a git repository, and {repo} is not one", details={"repo": str(repo)}
            )
        key = (repo, base_commit)
        if key in self._by_sha:
            return self._by_sha[key]
        resolved = _resolve(repo, base_commit or "HEAD")
        marker = self._dir() / f"{resolved.tree}.checked"
        if not marker.exists():
            _entries(repo, resolved.tree)
            marker.touch()
        if len(base_commit) in (40, 64) and _HEX.fullmatch(base_commit):
            self._by_sha[key] = resolved
        return resolved

    def export(self, tree: ResolvedTree) -> Path:
        """A directory holding exactly ``tree`` (shared and reused: callers copy it, never change it)."""
        final = self._dir() / tree.tree
        if final.is_dir():
            return final
        staging = Path(tempfile.mkdtemp(prefix=f".{tree.tree}-", dir=self._dir()))
        try:
            _export(tree.repo, tree.tree, staging)
            _publish(staging, final)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        return final

    def pack(self, tree: ResolvedTree) -> Path:
        """A pack of every object of ``tree`` (and nothing else: no commit, no history)."""
        final = self._dir() / f"{tree.tree}.pack"
        if final.is_file():
            return final
        objects = _git(tree.repo, ["rev-list", "--objects", "--end-of-options", tree.tree], what="listing objects")
        data = _git(tree.repo, ["pack-objects", "--stdout", "-q"], stdin=objects, what="packing the base tree")
        fd, staging = tempfile.mkstemp(prefix=".pack-", dir=self._dir())
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(staging, final)
        return final

    def cached_pack(self, tree: str) -> Path | None:
        """The cached pack of ``tree``'s objects (one :meth:`pack` or :meth:`store_pack` wrote), if there is one."""
        if not _HEX.fullmatch(tree):
            raise InvalidArgument(f"{tree!r} is not a tree sha")
        final = self._dir() / f"{tree}.pack"
        return final if final.is_file() else None

    def store_pack(self, tree: str, data: bytes) -> Path:
        """Keep ``data``, a pack of every object of ``tree`` made elsewhere (in a runtime), as its cached pack.

        The caller vouches for the pack (it was made before any agent code ran); a pack that lacks an object
        makes the patch fail to collect rather than change it.
        """
        if not _HEX.fullmatch(tree):
            raise InvalidArgument(f"{tree!r} is not a tree sha")
        fd, staging = tempfile.mkstemp(prefix=".pack-", dir=self._dir())
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        final = self._dir() / f"{tree}.pack"
        os.replace(staging, final)
        return final

    def snapshot(self, directory: Path) -> ResolvedTree:
        """The tree of a plain directory as ``git add -A`` sees it (``.gitignore`` respected), in a private store.

        The returned ``repo`` is the private store, so :meth:`pack` packs from it.
        """
        store = self._dir() / "snapshots.git"
        if not (store / "objects").is_dir():
            staging = Path(tempfile.mkdtemp(prefix=".store-", dir=self._dir()))
            _git(staging, ["init", "-q", "--bare", "."], what="creating the snapshot store")
            _publish(staging, store)
            shutil.rmtree(staging, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=self._dir()) as tmp:
            env = _env()
            env.update(GIT_DIR=str(store), GIT_WORK_TREE=str(directory), GIT_INDEX_FILE=f"{tmp}/index")
            for args in (["add", "-A", "."], ["write-tree"]):
                done = subprocess.run(
                    ["git", *_SAFE, "-c", "core.excludesFile=/dev/null", *args],
                    cwd=directory,
                    env=env,
                    capture_output=True,
                    check=False,
                )
                if done.returncode != 0:
                    detail = done.stderr.decode("utf-8", "replace").strip()[-500:]
                    raise FailedPrecondition(f"snapshotting the task's repository {directory} failed: {detail}")
        return ResolvedTree(store, "", done.stdout.decode().strip())
