"""The evaluation log: one plain-text file per evaluation, referenced by ``log_ref``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from runtimes import ExecResult

__all__ = ["EvalLog"]


class EvalLog:
    """Appends sections to a log file (created with its parent directory)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, title: str, body: str = "") -> None:
        """Append a titled section."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(f"=== {stamp} {title}\n")
            if body:
                fh.write(body if body.endswith("\n") else body + "\n")

    def command(self, argv: Sequence[str], result: ExecResult) -> None:
        """Append a command, its exit status and its output."""
        status = "timed out" if result.timed_out else f"exit {result.exit_code}"
        self.write(
            f"$ {' '.join(argv)}  ({status}, {result.duration_s:.2f}s)",
            f"--- stdout\n{result.stdout}--- stderr\n{result.stderr}",
        )
