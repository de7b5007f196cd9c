"""Admission's check that a task's harness program exists, so a missing CLI is refused, not scored.

A session whose harness cannot start would otherwise run, exit at once, and (before the gateway told these
apart) be evaluated as an empty patch: the policy blamed for an installation problem. The check runs on the
gateway's host, so it is meaningful for ``local`` runtimes, which see the host's files (container runtimes
bring their own programs in the image, and are not checked).

Domain code only: no grpc, no protobuf.
"""

from __future__ import annotations

import os
import shutil
from pathlib import PurePosixPath

from gateway.harnesses import HarnessLaunch
from polar_core.errors import FailedPrecondition

__all__ = ["INSTALL_HINT", "check_program"]

INSTALL_HINT = (
    "install the harness CLIs with `bash scripts/setup_harnesses.sh` (the gateway then finds "
    ".harnesses/node_modules/.bin), or point POLAR_GATEWAY_HARNESS_BIN_DIR at the directory holding it"
)


def check_program(harness: str, launch: HarnessLaunch, *, session_root: PurePosixPath) -> None:
    """Raise unless the program ``launch`` starts can be found on the gateway's host.

    Args:
        harness: The harness name, for the message.
        launch: The launch of a dry-run preparation (its ``PATH`` is the harness's own).
        session_root: The made-up session directory of the dry run; programs below it (in the workspace the
            task brings) cannot be checked before the session exists.

    Raises:
        FailedPrecondition: The program is not there; the message names it and how to install it.
    """
    program = launch.argv[0]
    path = launch.env.get("PATH", "")
    if "/" in program:
        if not program.startswith("/") or PurePosixPath(program).is_relative_to(session_root):
            return
        found = os.access(program, os.X_OK)
    else:
        found = shutil.which(program, path=path) is not None
    if found:
        return
    raise FailedPrecondition(
        f"harness {harness!r} needs the CLI {program!r}, which this gateway cannot find "
        f"(looked on PATH {path!r}); {INSTALL_HINT}",
        details={"harness": harness, "cli": program, "reason": "harness_not_installed"},
    )
