"""The workspace's base: the tree the agent starts from and the patch is taken against.

Task keys read here: ``metadata.repo`` (or ``evaluator.options.repo``), the host directory the workspace is
made from, and ``metadata.base_commit`` (or ``evaluator.options.base_commit``). A git repository gives the
tree of ``base_commit`` (``HEAD`` without one), exported without its history; a plain directory is used as it
is, its base being what ``git add -A`` sees in it; no repository gives an empty workspace. Either way the
gateway keeps the base (a tree sha and a pack of its objects) on its own host, out of the agent's reach.

``metadata.workspace_image_path`` (an absolute path inside the runtime's image, e.g. ``/testbed`` of a
SWE-bench image) seeds the workspace from the image instead: at prepare, before any agent code runs, the
directory's contents (its ``.git`` left out, so no history and no future commits reach the agent) are copied
into the workspace inside the runtime and committed as the initial state; the tree of that commit and a pack
of its objects are then taken inside the runtime and the pack is downloaded to the gateway's host (cached by
tree sha), so the patch is taken against a base the agent cannot move, exactly as for a host repository.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import uuid
from pathlib import Path, PurePosixPath

from gateway.models import SessionSpec
from polar_core.errors import FailedPrecondition, InvalidArgument
from polar_core.git_trees import EMPTY_TREE, TreeCache, check_revision, is_git_repository
from runtimes import Runtime, RuntimeSpec

__all__ = [
    "WorkspaceBase",
    "image_base",
    "image_source",
    "repository_source",
    "require_image",
    "seed_argv",
    "validate_repository",
    "workspace_base",
]

_IMAGE_PATH_KEY = "metadata.workspace_image_path"
_SETUP_TIMEOUT_S = 600.0
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# $1 the directory in the image, $2 the workspace (absolute). ``cd`` follows a link named as the directory;
# its top-level ``.git`` (directory or gitfile) stays behind. GNU ``cp`` (as the swebench evaluator uses): the
# copies belong to the sandbox user, with the image's modes, timestamps and links.
_SEED_SCRIPT = """set -eu
if [ ! -d "$1" ]; then echo "$1 is not a directory in the runtime's image" >&2; exit 1; fi
mkdir -p "$2"
cd "$1"
find . -mindepth 1 -maxdepth 1 ! -name .git -exec sh -c 'cp -R --preserve=mode,timestamps,links "$@" "$0"/' "$2" {} +
"""
_GIT = "git -c safe.directory='*' -c core.hooksPath=/dev/null -c core.fsmonitor=false"
# $1 the workspace, just committed by the gateway (no agent code has run); $2 where to write the base pack
# (empty: only print the tree).
_BASE_SCRIPT = f"""set -eu
cd "$1"
tree=$({_GIT} rev-parse --verify -q 'HEAD^{{tree}}')
if [ -n "$2" ]; then {_GIT} rev-list --objects "$tree" | {_GIT} pack-objects --stdout -q > "$2"; fi
echo "$tree"
"""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkspaceBase:
    """What a session's workspace starts as.

    Attributes:
        directory: Host directory copied in as the workspace (``None``: an empty workspace).
        tree: The base tree's sha, which the patch is taken against.
        pack: Host path of a pack of the base tree's objects (``None`` for the empty tree).
        commit: The base commit's sha, for a git repository.
    """

    directory: Path | None
    tree: str
    pack: Path | None
    commit: str = ""


def repository_source(spec: SessionSpec) -> tuple[str, str]:
    """``(repo, base_commit)`` of a session's task, either empty when not given.

    Raises:
        InvalidArgument: ``base_commit`` is not a string naming a hex sha or a plain ref, or comes without a repo.
    """
    repo = spec.metadata.get("repo") or spec.evaluator.options.get("repo") or ""
    rev = spec.metadata.get("base_commit") or spec.evaluator.options.get("base_commit") or ""
    if not isinstance(rev, str):
        raise InvalidArgument("base_commit must be a string (quote it in the task file)")
    if rev:
        check_revision(rev)
        if not repo:
            raise InvalidArgument("base_commit needs a repository (repo)", details={"base_commit": rev})
    return str(repo), rev


def _repository(repo: str, *, must_exist: bool = True) -> Path:
    """The task's repository on this host, or a clear error naming what is wrong with the path."""
    path = Path(repo)
    if not path.is_absolute():
        raise InvalidArgument(
            f"the task's repository {repo!r} is a relative path: a task must name it absolutely "
            "(polar submit, polar run and polar_client.load_task resolve a task file's paths against its folder)",
            details={"repo": repo},
        )
    if must_exist and not path.exists():
        raise FailedPrecondition(
            f"the task's repository {repo} does not exist on this gateway's host", details={"repo": repo}
        )
    return path


def validate_repository(spec: SessionSpec, trees: TreeCache) -> None:
    """Admission checks: the path is absolute and, when it exists here, ``base_commit`` names a commit of it.

    Raises:
        InvalidArgument: A relative path, a malformed or unknown ``base_commit``, ``base_commit`` on a plain
            directory, a submodule or an unsafe path in the base tree.
    """
    image_source(spec)
    repo, rev = repository_source(spec)
    if not repo:
        return
    path = _repository(repo, must_exist=False)
    if is_git_repository(path):
        trees.resolve(path, rev)
    elif rev and path.exists():
        trees.resolve(path, rev)  # raises: base_commit needs a git repository


def workspace_base(spec: SessionSpec, trees: TreeCache) -> WorkspaceBase:
    """Resolve, export and pack the session's base (blocking: run it in a thread).

    Raises:
        InvalidArgument: As :func:`validate_repository`.
        FailedPrecondition: The repository does not exist on this host, or git failed, or the task's base lies
            in the runtime's image (only :func:`image_base`, at prepare, knows it).
    """
    if image_source(spec):
        raise FailedPrecondition(
            "the base of a workspace seeded from the image is taken when the session is prepared, and this "
            "gateway has no record of it",
            details={"field": _IMAGE_PATH_KEY},
        )
    repo, rev = repository_source(spec)
    if not repo:
        return WorkspaceBase(None, EMPTY_TREE, None)
    path = _repository(repo)
    if is_git_repository(path):
        resolved = trees.resolve(path, rev)
        return WorkspaceBase(trees.export(resolved), resolved.tree, trees.pack(resolved), resolved.commit)
    if rev:
        trees.resolve(path, rev)  # raises: base_commit needs a git repository
    snapshot = trees.snapshot(path)
    return WorkspaceBase(path, snapshot.tree, trees.pack(snapshot))


def image_source(spec: SessionSpec) -> str:
    """``metadata.workspace_image_path``, checked: ``""`` when the task does not seed its workspace from the image.

    Raises:
        InvalidArgument: Not a string, not an absolute normalised path below ``/`` (``..``, ``//``, a NUL
            refused), or given together with a host repository (``repo``) or a ``base_commit``.
    """
    value = spec.metadata.get("workspace_image_path")
    if value is None or value == "":
        return ""
    details = {"field": _IMAGE_PATH_KEY}
    if not isinstance(value, str):
        raise InvalidArgument(f"{_IMAGE_PATH_KEY} must be a string", details=details)
    path = PurePosixPath(value)
    if not path.is_absolute() or ".." in path.parts or str(path) == "/" or "\0" in value or "//" in value:
        raise InvalidArgument(
            f"{_IMAGE_PATH_KEY} {value!r} must be an absolute path below / inside the runtime's image (without '..')",
            details=details,
        )
    metadata, options = spec.metadata, spec.evaluator.options
    if any(m.get(k) for m in (metadata, options) for k in ("repo", "base_commit")):
        raise InvalidArgument(
            f"{_IMAGE_PATH_KEY} seeds the workspace from the image; the task cannot also name a host "
            "repository or base_commit (the image's directory is the base as it is)",
            details=details,
        )
    return str(path)


def seed_argv(image_path: str, workspace: PurePosixPath) -> list[str]:
    """The command copying ``image_path``'s contents (without its ``.git``) into ``workspace``, in the runtime."""
    return ["sh", "-c", _SEED_SCRIPT, "polar-seed", image_path, str(workspace)]


def require_image(runtime: Runtime, image_path: str) -> None:
    """Refuse to seed from ``image_path`` in a runtime that has no image (the local runtime sees the host), or
    from a directory that holds the session directory or lies in it (the copy would hold itself).

    Raises:
        FailedPrecondition: The session's runtime is not an image's, or the paths overlap.
    """
    path, root = PurePosixPath(image_path), runtime.root
    if path == root or root in path.parents or path in root.parents:
        raise FailedPrecondition(
            f"{_IMAGE_PATH_KEY} {image_path!r} overlaps the session directory {root}",
            details={"field": _IMAGE_PATH_KEY},
        )
    spec = getattr(runtime, "spec", None)
    if not isinstance(spec, RuntimeSpec) or not spec.image:
        raise FailedPrecondition(
            f"{_IMAGE_PATH_KEY} {image_path!r} needs a runtime with an image (docker or apptainer), and this "
            "session's runtime has none",
            details={"field": _IMAGE_PATH_KEY},
        )


async def _run(runtime: Runtime, argv: list[str], what: str) -> str:
    result = await runtime.exec(argv, timeout=_SETUP_TIMEOUT_S)
    if not result.ok:
        detail = (result.stderr or result.stdout).strip()[-500:]
        raise FailedPrecondition(f"{what} failed (exit {result.exit_code}): {detail}")
    return result.stdout


async def image_base(runtime: Runtime, workspace: PurePosixPath, trees: TreeCache) -> WorkspaceBase:
    """The base of a workspace just seeded from the image and committed, before any agent code ran.

    The tree is read in the runtime; its pack is made there and downloaded to the gateway's host unless the
    tree cache already has it (the same tree from an earlier session of the same image).

    Raises:
        FailedPrecondition: git failed in the runtime, or printed something that is not a tree sha.
    """
    what = "taking the base of the workspace seeded from the image"
    tree = (await _run(runtime, ["sh", "-c", _BASE_SCRIPT, "polar-base", str(workspace), ""], what)).strip()
    if not _SHA.fullmatch(tree):
        raise FailedPrecondition(f"{what}: git printed {tree[-100:]!r}, not a tree sha")
    pack = await asyncio.to_thread(trees.cached_pack, tree)
    if pack is None:
        remote = runtime.root / f".polar/base-{uuid.uuid4().hex}.pack"
        await _run(runtime, ["mkdir", "-p", str(remote.parent)], what)
        await _run(runtime, ["sh", "-c", _BASE_SCRIPT, "polar-base", str(workspace), str(remote)], what)
        data = await runtime.download(remote)
        await _run(runtime, ["rm", "-f", "--", str(remote)], what)
        pack = await asyncio.to_thread(trees.store_pack, tree, data)
    return WorkspaceBase(None, tree, pack)
