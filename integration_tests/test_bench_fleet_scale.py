"""``bench/fleet_scale --quick`` runs end to end: every session ends once, nothing is lost or delivered twice.

The bench starts its own PostgreSQL, ``polar serve rollout`` and two processes of simulated gateways (8 real
GatewayService servers), submits groups and a backlog, and watches them with WatchTask. Only behaviour is
asserted (the table, the exactly-once line, zero lost and zero twice per phase), never a time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from integration_tests.support.postgres import postgres_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not postgres_available(), reason="PostgreSQL 15 server binaries are not installed"),
]

ROOT = Path(__file__).resolve().parents[1]
PHASES = {"baseline": None, "16": None, "64": None, "queued": 512}


def _table(output: str) -> dict[str, dict[str, str]]:
    lines = [line for line in output.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows: dict[str, dict[str, str]] = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == len(header):
            rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def test_quick_fleet_bench_ends_every_session_once(tmp_path: Path) -> None:
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench.fleet_scale", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = bench.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        bench.terminate()  # the bench stops its PostgreSQL, server and gateways on SIGTERM
        out, err = bench.communicate(timeout=50)
    assert bench.returncode == 0, out[-3000:] + err[-3000:]
    assert "exactly once: every session ended once, none lost or delivered twice" in out, out
    rows = _table(out)
    assert set(rows) == set(PHASES), out
    for phase, expected in PHASES.items():
        row = rows[phase]
        assert row["lost"] == "0", row
        assert row["twice"] == "0", row
        sessions = int(row["sessions"].replace(",", ""))
        assert sessions > 0, row
        if expected is not None:
            assert sessions == expected, row
    assert "terminal statuses: {'resolved': " in out, out
    assert "server RSS right after 512 were queued" in out, out
