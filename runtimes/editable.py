"""Point an image's editable installs of a repository at the session's copy of that repository.

A SWE-bench image holds the repository at ``/testbed``, installed into its Python environment in editable mode
(``pip install -e .``): a ``.pth`` or ``.egg-link`` line naming ``/testbed`` (or ``/testbed/src``), or a
setuptools finder module mapping each package to its directory there. Polar's runtimes run commands
unprivileged on a read-only root file system, so the agent works in, and the evaluator grades, a *copy* of the
repository under the session directory. Without help, ``import django`` in that copy still finds the image's
``/testbed``: the agent's tests, and the grading, would run the unpatched code whenever the test command does not
put the copy first on ``sys.path`` itself (Django's ``tests/runtests.py``, any ``src/`` layout, ``pytest`` run
from a ``tests/`` directory without ``__init__.py``).

So, at prepare, before any agent or patch code runs, :func:`editable_paths` scans the image's ``*-packages``
directories for editable-install markers that name the repository and maps each path into the copy. The files
scanned come from the image, never from the agent. The two sides use the paths differently:

* the evaluator puts them on ``PYTHONPATH`` for the eval script: first on ``sys.path`` in every interpreter,
  venvs included;
* the agent's runtime gets them as a ``.pth`` file in the session user's site directory
  (:func:`redirect_editables`: ``$HOME/.local/lib/python3.X/site-packages``, for every ``X``) whose one
  ``import`` line (:func:`pth_line`) puts them before the first site directory: read by the system Python,
  conda environments (the official SWE-bench images) and venvs with system site packages, and never by an
  isolated venv (a Python agent harness's own, and so also not by an image's isolated venv): ``PYTHONPATH``
  there would also reach into the harness's own imports.
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath

from runtimes.base import Runtime
from runtimes.errors import RuntimeDied

__all__ = ["USER_SITE_VERSIONS", "editable_paths", "editable_roots", "pth_line", "redirect_editables", "scan_argv"]

USER_SITE_VERSIONS = tuple(f"3.{minor}" for minor in range(6, 15))
"""The Python versions whose user site directories get the ``.pth`` (an image's interpreter is not known)."""
_PTH_NAME = "polar-editable-copy.pth"
# Lines of editable-install markers in the image's site directories that mention the repository's path.
_SCAN = r"""
find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path "$2" \) -prune -o -type f \
  \( -name '*.pth' -o -name '*.egg-link' -o -name '__editable___*finder.py' \) -path '*-packages/*' \
  -exec grep -H -F -e "$1" {} + 2>/dev/null
exit 0
"""
_WRITE = (
    'pth="$1"; shift\n'
    f"for version in {' '.join(USER_SITE_VERSIONS)}; do\n"
    '  dir="$HOME/.local/lib/python$version/site-packages"\n'
    '  mkdir -p "$dir" && printf \'%s\\n\' "$@" > "$dir/$pth" || exit 1\n'
    "done\n"
)
_QUOTED = re.compile(r"""["'](/[^"'\n]*)["']""")
_SCAN_TIMEOUT_S = 300.0


def scan_argv(image_path: str, session_root: PurePosixPath) -> list[str]:
    """The command printing ``file:line`` for each marker line mentioning ``image_path`` (the session pruned)."""
    return ["sh", "-c", _SCAN, "polar-editables", image_path, str(session_root)]


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/")


def editable_roots(scan_output: str, image_path: str) -> list[str]:
    """The directories under ``image_path`` that the image's editable installs put on ``sys.path``, in order.

    Args:
        scan_output: ``file:line`` lines (:func:`scan_argv`'s output).
        image_path: The repository's path in the image.

    A ``.pth`` / ``.egg-link`` path line names a directory itself; a finder module's (or an ``import`` line's)
    quoted paths name packages or modules, whose parent directory goes on ``sys.path``. Relative lines and
    paths elsewhere are ignored.
    """
    roots: list[str] = []
    for entry in scan_output.splitlines():
        marker, sep, line = entry.partition(":")
        if not sep:
            continue
        text = line.strip()
        if marker.endswith(".py"):
            found = [str(PurePosixPath(p).parent) for p in _QUOTED.findall(text)]
        elif text.startswith(("import ", "import\t")):
            found = _QUOTED.findall(text)
        else:
            found = [text.rstrip("/") or "/"]
        roots.extend(p for p in found if _under(p, image_path) and p not in roots)
    return roots


def pth_line(paths: list[str]) -> str:
    """The user-site ``.pth`` line putting ``paths`` just before the first site directory on ``sys.path``.

    An ``import`` line, not plain path lines (which would be appended): a venv with system site packages reads
    its own site directory, and the editable ``.pth`` there, before the user site, so plain lines would come
    after the image's ``/testbed``. Inserted before the first ``*-packages`` entry when the line runs (a venv's
    own site directory; the user site directory itself, which site.py appends before reading its ``.pth``
    files, for the system Python or a conda environment), the copy's directories come after the standard
    library and before every site directory.
    """
    return (
        "import sys; sys.path[next((n for n, d in enumerate(sys.path) if d.rstrip('/').endswith('-packages')), "
        f"len(sys.path)):0] = [d for d in {json.dumps(paths)} if d not in sys.path]"
    )


def _in_copy(path: str, image_path: str, copy: PurePosixPath) -> str:
    rel = path[len(image_path.rstrip("/")) :].lstrip("/")
    return str(copy / rel) if rel else str(copy)


async def editable_paths(runtime: Runtime, image_path: str, copy: PurePosixPath) -> list[str]:
    """The directories inside ``copy`` standing for those the image's editable installs of ``image_path`` add
    to ``sys.path`` (empty when the image has none)."""
    scan = await runtime.exec(scan_argv(image_path, runtime.root), timeout=_SCAN_TIMEOUT_S)
    return [_in_copy(p, image_path, copy) for p in editable_roots(scan.stdout, image_path)]


async def redirect_editables(runtime: Runtime, image_path: str, copy: PurePosixPath) -> list[str]:
    """Make the image's editable installs of ``image_path`` import from ``copy`` for this session's user (a
    user-site ``.pth``; see the module docstring for which interpreters read it).

    Returns:
        The paths written, empty when the image has no editable install of the repository.

    Raises:
        RuntimeDied: The ``.pth`` files could not be written (a message with the command's output).
    """
    paths = await editable_paths(runtime, image_path, copy)
    if not paths:
        return []
    argv = ["sh", "-c", _WRITE, "polar-user-site", _PTH_NAME, pth_line(paths)]
    wrote = await runtime.exec(argv, timeout=60.0)
    if not wrote.ok:
        raise RuntimeDied(f"cannot write the user-site .pth: {(wrote.stderr or wrote.stdout).strip()[-300:]}")
    return paths
