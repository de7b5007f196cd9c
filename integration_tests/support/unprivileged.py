"""Running a support module as an ordinary host user, from a test process that may be root.

A root test process runs the module with ``runuser`` as :data:`USER` (created when missing) and the system Python:
the one running the tests may live where that user cannot read (e.g. ``/root``). A test process that is already
unprivileged runs the module's code directly instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

__all__ = ["USER", "run_module_as", "unprivileged_dir", "unprivileged_user"]

USER = "polar-redteam"
SYSTEM_PYTHON = "/usr/bin/python3"
RUNUSER = shutil.which("runuser", path="/usr/sbin:/usr/bin:/sbin:/bin")
_REPO = Path(__file__).resolve().parent.parent.parent


def unprivileged_user() -> str | None:
    """A non-root host user to run the runtime as (created when missing), or None when impossible."""
    try:
        pwd.getpwnam(USER)
        return USER
    except KeyError:
        pass
    if shutil.which("useradd") is None:
        return None
    done = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
                          capture_output=True, check=False)  # fmt: skip
    return USER if done.returncode == 0 else None


@contextlib.contextmanager
def unprivileged_dir() -> Iterator[tuple[str, Path]]:
    """``(user, directory it owns)``; ``("", directory)`` when this process is not root. Skips where impossible."""
    if os.geteuid() != 0:
        with tempfile.TemporaryDirectory() as name:
            yield "", Path(name)
        return
    user = unprivileged_user()
    if user is None or RUNUSER is None or not Path(SYSTEM_PYTHON).exists():
        pytest.skip("cannot run as an unprivileged user here (no useradd/runuser or no system python3)")
    directory = Path(tempfile.mkdtemp(prefix="polar-unprivileged-"))
    shutil.chown(directory, user, user)
    try:
        yield user, directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def run_module_as(
    user: str, module: str, *args: str, timeout_s: float = 300, extra_path: Sequence[str] = ()
) -> tuple[int, bytes, bytes]:
    """Run ``python3 -m module args...`` as ``user``, with the repository (and ``extra_path``) importable.

    Returns ``(exit status, stdout, stderr)``. Skips the test when the system Python cannot import what the module
    needs.
    """
    path = os.pathsep.join([str(_REPO), str(_REPO / "gen"), *extra_path])
    assert RUNUSER is not None
    proc = await asyncio.create_subprocess_exec(
        RUNUSER, "-u", user, "--", SYSTEM_PYTHON, "-m", module, *args, cwd=_REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": path},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout_s)
    if proc.returncode != 0 and b"No module named" in stderr:
        pytest.skip(f"the system python cannot import what {module} needs: {stderr.decode()[-300:]}")
    assert proc.returncode is not None
    return proc.returncode, stdout, stderr
