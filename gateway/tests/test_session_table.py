"""SessionTable: finished sessions drop what grows with them, keep traces and results only within the bounds."""

from __future__ import annotations

from gateway.models import HarnessConfig, PipelineConfig, SessionResult, SessionSpec, Stage
from gateway.session import Session, SessionTable
from polar_core.records import TerminalStatus, Trace


def _done(session_id: str) -> Session:
    """A DONE session whose result carries one trace."""
    trace = Trace(session_id, "t", 0, ["c"], [1], [2], [1], [0.0])
    s = Session(spec=SessionSpec(session_id=session_id, task_id="t", harness=HarnessConfig("fake")), deadline=0.0,
                admitted_at=0.0, stage=Stage.DONE)  # fmt: skip
    s.result = SessionResult(session_id, "t", 0, 1, "gw", TerminalStatus.RESOLVED, 1.0, [trace], {})
    return s


def test_retention_drops_traces_then_results_beyond_their_bounds() -> None:
    table = SessionTable(PipelineConfig(retained_results=3, retained_traces=1))
    sessions = [_done(f"s{i}") for i in range(4)]
    for s in sessions:
        table.add(s)
        table.retain(s)
    assert table.get("s0") is None  # beyond retained_results: forgotten
    kept = [table.get(f"s{i}") for i in (1, 2, 3)]
    assert [s.result.traces != [] for s in kept if s is not None and s.result is not None] == [False, False, True]
    assert all(s.completions == [] and s.reconstruction is None for s in sessions)
    assert table.active() == 0


def test_a_running_session_is_never_forgotten() -> None:
    table = SessionTable(PipelineConfig())
    running = _done("s")
    running.stage = Stage.RUNNING
    table.add(running)
    table.forget("s")
    assert table.get("s") is running
    assert table.active() == 1
    assert list(table) == [running]
