"""The workspace patch: everything the agent changed in the workspace's base tree, as a git diff.

The same shell script serves the host (:func:`collect_patch`) and runtimes (``runtime.exec(patch_argv(ws))``),
so a patch looks identical wherever it was taken. The agent controls the workspace, including ``.git``, so the
patch is taken against a reference it cannot touch when the caller has one: a pack holding the base tree's
objects (made by the gateway and uploaded only after the agent ended) read into a private ``GIT_DIR``
outside the workspace, with the workspace as work tree, so commits, resets, rewritten history or a deleted or
replaced ``.git`` change nothing (git never treats a work tree's ``.git`` as content). Without one, the
workspace's first commit is the base. The script also turns off hooks, fsmonitor, external diff drivers,
textconv filters and the user's and system's git configuration, and uses a private index so the agent's
staging area is left as it was. Untracked files are included; ``.gitignore``'d ones are not.
"""

from __future__ import annotations

import subprocess
from pathlib import Path, PurePath

from polar_core.errors import FailedPrecondition

__all__ = [
    "INITIAL_COMMIT_MESSAGE",
    "PATCH_SCRIPT",
    "collect_patch",
    "init_workspace",
    "init_workspace_argv",
    "patch_argv",
]

INITIAL_COMMIT_MESSAGE = "polar: initial workspace"

_SAFE_GIT = (
    "git -c safe.directory='*' -c core.hooksPath=/dev/null -c core.fsmonitor=false -c diff.external= "
    "-c core.attributesFile=/dev/null"
)

# $1 is the workspace; $2 the base tree and $3 a pack of its objects (both empty: the workspace's first commit).
PATCH_SCRIPT = f"""set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset GIT_DIR GIT_WORK_TREE GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_COMMON_DIR
export HOME="$tmp" XDG_CONFIG_HOME="$tmp" GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
cd "$1"
if [ -n "${{2:-}}" ]; then
  {_SAFE_GIT} init -q "$tmp/ref"
  export GIT_DIR="$tmp/ref/.git" GIT_WORK_TREE="$1" GIT_INDEX_FILE="$tmp/index"
  if [ -n "${{3:-}}" ]; then {_SAFE_GIT} index-pack --stdin < "$3" > /dev/null; fi
  base=$2
  {_SAFE_GIT} read-tree "$base"
else
  base=$({_SAFE_GIT} rev-list --max-parents=0 HEAD | tail -n 1)
  export GIT_INDEX_FILE="$tmp/index"
  {_SAFE_GIT} read-tree HEAD
fi
{_SAFE_GIT} add -A .
{_SAFE_GIT} diff --cached --binary --no-color --no-ext-diff --no-textconv "$base" --
"""

# A fixed date: the initial commit of the same files is the same commit (the same sha) in every session, so an
# agent that shows git's log or status in its prompt (Claude Code does) sends every session the same prompt.
_INITIAL_COMMIT_DATE = "2020-01-01T00:00:00+0000"
_INIT_SCRIPT = f"""set -eu
cd "$1"
if [ ! -d .git ]; then {_SAFE_GIT} init -q; fi
{_SAFE_GIT} add -A .
GIT_AUTHOR_DATE="{_INITIAL_COMMIT_DATE}" GIT_COMMITTER_DATE="{_INITIAL_COMMIT_DATE}" \\
  {_SAFE_GIT} -c user.name=polar -c user.email=polar@localhost -c commit.gpgsign=false \\
  commit -q --allow-empty --no-verify -m "{INITIAL_COMMIT_MESSAGE}"
{_SAFE_GIT} rev-parse HEAD
"""


def patch_argv(workspace: str | PurePath, base_tree: str = "", pack: str | PurePath = "") -> list[str]:
    """The command that prints the workspace patch, for ``Runtime.exec`` (needs ``sh`` and ``git``).

    Args:
        workspace: The workspace.
        base_tree: The tree the patch is taken against; empty for the workspace's first commit.
        pack: A pack file holding ``base_tree``'s objects (empty for the empty tree).
    """
    return ["sh", "-c", PATCH_SCRIPT, "polar-patch", str(workspace), base_tree, str(pack)]


def init_workspace_argv(workspace: str | PurePath) -> list[str]:
    """The command that makes the workspace a git repository and commits its initial state; prints the sha."""
    return ["sh", "-c", _INIT_SCRIPT, "polar-init", str(workspace)]


def _run(argv: list[str], what: str) -> str:
    done = subprocess.run(argv, capture_output=True, check=False)
    if done.returncode != 0:
        stderr = done.stderr.decode("utf-8", "replace").strip()[-2000:]
        raise FailedPrecondition(f"{what} failed (exit {done.returncode}): {stderr}")
    return done.stdout.decode("utf-8", "surrogateescape")


def init_workspace(workspace: Path) -> str:
    """Commit the workspace's current state as its initial commit (``git init`` first if needed).

    Returns:
        The commit's sha.

    Raises:
        FailedPrecondition: git failed.
    """
    return _run(init_workspace_argv(workspace), "initialising the workspace repository").strip()


def collect_patch(workspace: Path, base_tree: str = "", pack: Path | None = None) -> str:
    """Return ``git diff`` of the workspace (tracked and untracked files) against its base.

    Args:
        workspace: The workspace.
        base_tree: The base tree (see :func:`patch_argv`); empty for the workspace's initial commit.
        pack: A pack of ``base_tree``'s objects.

    Raises:
        FailedPrecondition: The workspace is not a git repository with at least one commit (without a base
            tree), or git failed.
    """
    return _run(patch_argv(workspace, base_tree, pack or ""), "collecting the workspace patch")
