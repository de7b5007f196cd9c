"""Test helpers shared by the services' tests: a real git repository whose later commit holds the fix, and a
reader of the data points an in-memory OpenTelemetry metric reader collected."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

__all__ = ["BUGGY", "FIXED", "HistoryRepo", "MetricPoints", "git", "make_history_repo"]

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    # FIX-FROM-THE-FUTURE\n    return a + b\n"
_TESTS = (
    "from calc import add\n\n\n"
    "def test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_zero():\n    assert add(0, 0) == 0\n"
)
# Bytes that are not text (a NUL, invalid UTF-8): git stores and diffs them as binary.
BINARY = bytes(range(256)) * 4


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` (with a fixed identity) and return its stdout."""
    argv = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    return subprocess.run([*argv, *args], check=True, capture_output=True, text=True).stdout


@dataclasses.dataclass(frozen=True)
class HistoryRepo:
    """A repository of three commits: the buggy base, the fix, and a later change (``HEAD``).

    Attributes:
        path: The repository.
        base: The base commit's sha (the task's ``base_commit``).
        fix: The commit that fixes the bug.
        head: The last commit.
        fix_blob: The sha of the fixed ``calc.py`` (must never reach an agent).
        fix_patch: The reference fix as a diff against ``base``.
    """

    path: Path
    base: str
    fix: str
    head: str
    fix_blob: str
    fix_patch: str


def make_history_repo(path: Path) -> HistoryRepo:
    """Create the repository: ``calc.py`` (buggy ``add``), ``tests/test_calc.py``, ``data.bin``, ``run.sh``.

    ``tests/test_calc.py::test_add`` fails on the base and passes with the fix; ``test_zero`` passes on both.
    """
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "calc.py").write_text(BUGGY)
    (path / "tests").mkdir()
    (path / "tests" / "test_calc.py").write_text(_TESTS)
    (path / "data.bin").write_bytes(BINARY)
    (path / "run.sh").write_text("#!/bin/sh\necho run\n")
    (path / "run.sh").chmod(0o755)
    (path / ".gitignore").write_text("*.log\n")
    (path / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "base: add() is wrong")
    base = git(path, "rev-parse", "HEAD").strip()
    (path / "calc.py").write_text(FIXED)
    git(path, "commit", "-qam", "fix add()")
    fix = git(path, "rev-parse", "HEAD").strip()
    fix_blob = git(path, "rev-parse", "HEAD:calc.py").strip()
    (path / "README.md").write_text("later\n")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "later work")
    head = git(path, "rev-parse", "HEAD").strip()
    fix_patch = git(path, "diff", "--binary", base, fix)
    return HistoryRepo(path, base, fix, head, fix_blob, fix_patch)


class MetricPoints:
    """An SDK meter provider over an in-memory reader, and look-ups of what it collected (unit tests)."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])

    def points(self, name: str, **attributes: str) -> list[Any]:
        """The data points of instrument ``name`` whose attributes include ``attributes`` (collected now)."""
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            labels = point.attributes or {}
                            if all(labels.get(k) == v for k, v in attributes.items()):
                                found.append(point)
        return found

    def value(self, name: str, **attributes: str) -> float:
        """The summed value (counters, gauges) or summed ``sum`` (histograms) of the matching points."""
        return float(sum(p.value if hasattr(p, "value") else p.sum for p in self.points(name, **attributes)))

    def count(self, name: str, **attributes: str) -> int:
        """The summed ``count`` of the matching histogram points."""
        return sum(int(p.count) for p in self.points(name, **attributes))
