"""A few real pi sessions on a gateway host (four ``polar serve`` processes) leave no process and no sandbox.

The run is :func:`bench.host_capacity.run_one` at a small N: every session runs the real pi CLI in the local
bubblewrap sandbox through the tunnel, a scripted 3-call tool loop that fixes the paginate example, and is scored
by the ``swe`` evaluator in a sandbox of its own. Afterwards no process works or runs under the run's directory
and neither the gateway's nor the evaluator's runtime directory keeps a session directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.host_capacity.__main__ import run_one
from integration_tests.support.harnesses import clis_installed

pytestmark = pytest.mark.skipif(
    not clis_installed(), reason="harness CLIs (setup_harnesses.sh) or bubblewrap not installed"
)


@pytest.mark.timeout(300)
async def test_real_sessions_leave_no_processes_or_sandboxes(tmp_path: Path) -> None:
    args = argparse.Namespace(
        calls=3, timeout=120.0, init_workers=None, ready_capacity=None, postrun_workers=2, isolation="bwrap"
    )
    result = await run_one(3, tmp_path / "host", args)
    assert result.statuses == {"resolved": 3}, result
    assert result.calls == [3, 3, 3]
    assert result.leaked_processes == []
    assert result.leaked_sandboxes == []
    assert result.peak_sandbox_processes > 0  # the check looks where the sandboxes were
