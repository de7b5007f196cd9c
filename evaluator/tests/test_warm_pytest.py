"""The evaluator warms its local Python's pytest once: plugin modules' assertion-rewrite caches get written."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from evaluator import core


def test_warm_up_writes_the_rewrite_caches_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = tmp_path / "pycache"
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(prefix))  # where this run's caches go, so the test sees them
    monkeypatch.setattr(core, "_warmed_pythons", set())
    core._warm_pytest(sys.executable)
    rewritten = list(prefix.rglob("*-pytest-*.pyc"))
    assert rewritten, "pytest wrote no assertion-rewrite cache"
    assert sys.executable in core._warmed_pythons
    for path in rewritten:
        path.unlink()
    core._warm_pytest(sys.executable)  # once per process: nothing runs again
    assert not list(prefix.rglob("*-pytest-*.pyc"))
