"""The run directory rows, the summary and the progress counts (no ports)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from polar.common.v1 import session_pb2, trace_pb2
from polar.rollout.v1 import rollout_service_pb2
from rich.console import Console

from polar_core.errors import InvalidArgument
from polar_run.embedded import context_length
from polar_run.progress import STAGES, ProgressDisplay, ProgressState
from polar_run.run_output import print_summary, session_row, summarize, write_run_directory
from polar_run.settings import RunSettings


def _result(
    index: int, status: str, reward: float, *, calls: int, masks: list[list[int]], attempt: int = 1
) -> session_pb2.SessionResult:
    result = session_pb2.SessionResult(
        session_id=f"t-{index:04d}",
        task_id="t",
        status=status,
        reward=reward,
        sample_index=index,
        attempt=attempt,
        timings={"init": 0.5, "running": 2.0, "total": 3.0},
    )
    result.statistics.completions = calls
    for i, mask in enumerate(masks):
        result.traces.append(
            trace_pb2.Trace(
                session_id=result.session_id,
                task_id="t",
                trace_index=i,
                call_ids=[f"c{i}"],
                prompt_token_ids=[1, 2],
                response_token_ids=list(range(len(mask))),
                loss_mask=mask,
                response_logprobs=[-0.1 if m else 0.0 for m in mask],
                reward=reward,
                weight=1.0 / len(masks),
                status=status,
                exact_context=True,
                policy_versions=["0"],
            )
        )
    return result


def test_session_row_has_the_contract_fields() -> None:
    row = session_row(_result(0, "resolved", 1.0, calls=2, masks=[[1, 1, 0, 1]]))
    assert {"session_id", "task_id", "status", "reward", "timings"} <= set(row)
    assert row["trainable_tokens"] == 3
    assert row["traces"] == 1
    assert row["calls"] == 2
    assert row["timings"]["total"] == 3.0
    assert row["duration_s"] == 3.0


def test_summary_rows_add_up_and_files_agree(tmp_path: Path) -> None:
    results = [
        _result(0, "resolved", 1.0, calls=2, masks=[[1, 1], [1]]),
        _result(1, "unresolved", 0.0, calls=1, masks=[[1, 0, 1]]),
        _result(2, "infra_error", 0.0, calls=0, masks=[], attempt=2),
        _result(3, "agent_timeout", 0.0, calls=3, masks=[[1]]),
    ]
    rows = [session_row(r) for r in results]
    stats = rollout_service_pb2.TaskStatistics(sessions_dropped=1, sessions_retried=1, sessions_truncated=1)
    summary = summarize(rows, statistics=stats, extra={"task_id": "t"})
    assert summary["sessions"] == 4
    for key in ("sessions", "calls", "trainable_tokens", "traces"):
        assert sum(block[key] for block in summary["by_status"].values()) == summary[key]
    assert summary["trainable_tokens"] == 3 + 2 + 1
    assert summary["sessions_usable"] == 3
    assert summary["sessions_dropped"] == 1
    assert summary["sessions_truncated"] == 1
    assert summary["sessions_retried"] == 1
    assert summary["statistics"]["sessions_dropped"] == 1
    counts = write_run_directory(tmp_path, results=results, completions=[{"session_id": "t-0000"}], summary=summary)
    assert counts == {"completions.jsonl": 1, "traces.jsonl": 4, "sessions.jsonl": 4}
    assert json.loads((tmp_path / "summary.json").read_text())["sessions"] == 4
    console = Console(record=True, width=120)
    print_summary(console, summary, title="t")
    text = console.export_text()
    assert "resolved" in text
    assert "trainable tokens" in text
    assert "1 / 1 / 1" in text


def test_summary_shows_the_policy_lag() -> None:
    results = [_result(i, "resolved", 1.0, calls=1, masks=[[1]]) for i in range(3)]
    for result, lag in zip(results, (0, 2, 1), strict=True):
        result.policy_lag = lag
        result.traces[0].policy_lag = lag
    rows = [session_row(r) for r in results]
    assert [r["policy_lag"] for r in rows] == [0, 2, 1]
    stats = rollout_service_pb2.TaskStatistics(
        policy_lag=rollout_service_pb2.Distribution(count=3, mean=1.0, p50=1.0, p90=2.0, max=2.0),
        sessions_stale_resampled=4,
        sessions_stale_kept=1,
    )
    summary = summarize(rows, statistics=stats)
    assert summary["policy_lag"] == {"mean": 1.0, "max": 2}
    assert summary["statistics"]["policy_lag"]["max"] == 2.0
    assert summary["statistics"]["sessions_stale_resampled"] == 4
    console = Console(record=True, width=120)
    print_summary(console, summary, title="t")
    text = console.export_text()
    lines = {line.split("  ")[0]: line.split("  ", 1)[1].strip() for line in text.splitlines() if "  " in line}
    assert lines["policy lag"] == "mean 1.0 · p50 1.0 · p90 2.0 · max 2.0"
    assert lines["stale resampled / kept"] == "4 / 1"


def test_progress_counts_always_sum_to_the_total() -> None:
    now = [0.0]
    state = ProgressState(3, clock=lambda: now[0])
    assert state.stage_counts() == {"queued": 3, "init": 0, "ready": 0, "running": 0, "postrun": 0, "done": 0}
    state.stage("a", "init")
    state.stage("b", "running")
    state.stage("c", "done")  # the gateway is done, the rollout server has not recorded it yet
    counts = state.stage_counts()
    assert counts["postrun"] == 1
    assert sum(counts.values()) == 3
    state.finished("c", "resolved", 1.0, 2)
    state.finished("c", "resolved", 1.0, 2)  # a duplicate is ignored
    state.stage("c", "init")  # late events of a finished session are ignored
    assert state.stage_counts()["done"] == 1
    assert sum(state.stage_counts().values()) == 3
    state.add_sessions(2)
    assert sum(state.stage_counts().values()) == 5
    assert state.status_counts() == {"resolved": 1}
    assert state.calls == 2
    assert state.mean_reward == 1.0
    now[0] = 75.0
    assert state.line().startswith("[1:15] queued=2 init=1")
    assert list(state.stage_counts()) == list(STAGES)


def test_plain_display_prints_only_changes() -> None:
    console = Console(record=True, width=200)
    state = ProgressState(1)
    with ProgressDisplay(console, "title", state, live=False) as display:
        display.changed()
        display.changed()
        state.stage("a", "running")
        display.changed()
    lines = [line for line in console.export_text().splitlines() if line.startswith("[")]
    assert len(lines) == 3  # first state, the change, the final line on exit


def test_what_each_agent_did_is_kept_in_its_folder(tmp_path: Path) -> None:
    evaluation_log = tmp_path / "eval.log"
    evaluation_log.write_text("evaluate ...\n")
    kept = _result(0, "agent_timeout", 1.0, calls=1, masks=[[1]])
    kept.session_id = "t/odd id"
    kept.patch = b"diff --git a/x b/x\n"
    kept.patch_truncated = True
    kept.test_outcomes.add(test_id="tests/t.py::a", outcome="passed").duration.FromMilliseconds(250)
    kept.test_outcomes.add(test_id="tests/t.py::b", outcome="failed")
    kept.eval_log_ref = str(evaluation_log)
    kept.harness_stdout, kept.harness_stderr = "out", "err"
    bare = _result(1, "infra_error", 0.0, calls=0, masks=[])
    out = tmp_path / "run"
    write_run_directory(out, results=[kept, bare], completions=[], summary={})
    rows = [json.loads(line) for line in (out / "sessions.jsonl").read_text().splitlines()]
    assert rows[0]["files"] == "sessions/t_odd_id"
    assert rows[0]["patch_bytes"] == len(kept.patch)
    assert rows[0]["patch_truncated"]
    assert rows[0]["tests"] == {"failed": 1, "passed": 1}
    folder = out / rows[0]["files"]
    assert (folder / "patch.diff").read_bytes() == kept.patch
    tests = json.loads((folder / "tests.json").read_text())
    assert tests[0] == {"test_id": "tests/t.py::a", "outcome": "passed", "duration_s": 0.25}
    assert (folder / "harness.log").read_text() == "--- stdout ---\nout\n--- stderr ---\nerr\n"
    assert (folder / "eval.log").read_text() == "evaluate ...\n"
    assert rows[1]["tests"] == {}
    assert list((out / rows[1]["files"]).iterdir()) == []  # nothing to keep, nothing written


def test_context_length_from_the_option_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POLAR_PROXY_CONTEXT_LENGTH", raising=False)
    assert context_length(None, RunSettings.load()) == 0
    assert context_length(8192, RunSettings.load()) == 8192
    monkeypatch.setenv("POLAR_PROXY_CONTEXT_LENGTH", "16384")
    assert context_length(None, RunSettings.load()) == 16384
    assert context_length(8192, RunSettings.load()) == 8192
    with pytest.raises(InvalidArgument):
        context_length(0, RunSettings.load())
    monkeypatch.setenv("POLAR_PROXY_CONTEXT_LENGTH", "")
    assert context_length(None, RunSettings.load()) == 0
    for bad in ("lots", "-1"):
        monkeypatch.setenv("POLAR_PROXY_CONTEXT_LENGTH", bad)
        with pytest.raises(InvalidArgument, match="POLAR_PROXY_CONTEXT_LENGTH"):
            RunSettings.load()
