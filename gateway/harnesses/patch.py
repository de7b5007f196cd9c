"""The workspace patch: everything the agent changed since the workspace's initial commit, as a git diff.

The same shell script serves the host (:func:`collect_patch`) and runtimes (``runtime.exec(patch_argv(ws))``),
so a patch looks identical wherever it was taken. The agent controls the workspace, including ``.git``; the
script therefore turns off hooks, fsmonitor, external diff drivers and textconv filters, and uses a private
index so the agent's staging area is left as it was.
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

# $1 is the workspace. Untracked files are included (git add -A on a private index); .gitignore'd ones are not.
PATCH_SCRIPT = f"""set -eu
cd "$1"
base=$({_SAFE_GIT} rev-list --max-parents=0 HEAD | tail -n 1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GIT_INDEX_FILE="$tmp/index"
{_SAFE_GIT} read-tree HEAD
{_SAFE_GIT} add -A .
{_SAFE_GIT} diff --cached --binary --no-color --no-ext-diff --no-textconv "$base"
"""

_INIT_SCRIPT = f"""set -eu
cd "$1"
if [ ! -d .git ]; then {_SAFE_GIT} init -q; fi
{_SAFE_GIT} add -A .
{_SAFE_GIT} -c user.name=polar -c user.email=polar@localhost -c commit.gpgsign=false \\
  commit -q --allow-empty --no-verify -m "{INITIAL_COMMIT_MESSAGE}"
{_SAFE_GIT} rev-parse HEAD
"""


def patch_argv(workspace: str | PurePath) -> list[str]:
    """The command that prints the workspace patch, for ``Runtime.exec`` (needs ``sh`` and ``git``)."""
    return ["sh", "-c", PATCH_SCRIPT, "polar-patch", str(workspace)]


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


def collect_patch(workspace: Path) -> str:
    """Return ``git diff`` of the workspace (tracked and untracked files) against its initial commit.

    Raises:
        FailedPrecondition: The workspace is not a git repository with at least one commit, or git failed.
    """
    return _run(patch_argv(workspace), "collecting the workspace patch")
