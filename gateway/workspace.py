"""The workspace's base: the tree the agent starts from and the patch is taken against.

Task keys read here: ``metadata.repo`` (or ``evaluator.options.repo``), the host directory the workspace is
made from, and ``metadata.base_commit`` (or ``evaluator.options.base_commit``). A git repository gives the
tree of ``base_commit`` (``HEAD`` without one), exported without its history; a plain directory is used as it
is, its base being what ``git add -A`` sees in it; no repository gives an empty workspace. Either way the
gateway keeps the base (a tree sha and a pack of its objects) on its own host, out of the agent's reach.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gateway.models import SessionSpec
from polar_core.errors import FailedPrecondition, InvalidArgument
from polar_core.git_trees import EMPTY_TREE, TreeCache, check_revision, is_git_repository

__all__ = ["WorkspaceBase", "repository_source", "validate_repository", "workspace_base"]


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
        FailedPrecondition: The repository does not exist on this host, or git failed.
    """
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
