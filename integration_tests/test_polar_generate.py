"""``polar generate`` over ``examples/datasets/tiny`` with the scripted backend and the real pi CLI.

The script gives each session its own turns: the first paginate sample fixes the bug, the second answers with
nothing (an empty generation, re-run once as ``paginate-off-by-one.retry1-0000``, which fixes it); every other
session answers in plain text. So the ledger must show 10 samples, 11 sessions, 1 empty retry, 2 accepted and
8 rejected as unresolved, with rows summing exactly to the totals, and the two accepted trajectories must be
exported as SFT records (JSONL and Parquet) in the split of their repository.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from integration_tests.support.polar_cli import FIX_SCRIPT, HARNESS_BIN, REPO, read_jsonl, run_polar, write_script

pytestmark = [
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for workspaces"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is needed for the local runtime"),
    pytest.mark.skipif(not (HARNESS_BIN / "pi").exists(), reason="pi not installed (scripts/setup_harnesses.sh)"),
]
COLUMNS = ("tasks", "samples", "sessions", "attempts", "retries", "empty_retries", "accepted")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_generate_over_the_tiny_dataset(tmp_path: Path) -> None:
    fix = write_script(tmp_path / "fix.jsonl", FIX_SCRIPT)
    empty = write_script(tmp_path / "empty.jsonl", [{"text": ""}])
    plain = write_script(tmp_path / "plain.jsonl", [{"text": "I read the code; it looks right to me."}])
    sessions = {
        "paginate-off-by-one-0000": str(fix),
        "paginate-off-by-one-0001": str(empty),
        "paginate-off-by-one.retry1-0000": str(fix),
    }
    out = tmp_path / "gen"
    proc = run_polar(
        "generate", str(REPO / "examples" / "datasets" / "tiny"), "--out", str(out),
        "--backend", "scripted", "--model", "tiny",
        "--backend-option", f"script={plain}", "--backend-option", f"sessions={json.dumps(sessions)}",
        "--harness-dir", str(HARNESS_BIN.parent.parent),
        "--task-root", str(REPO / "examples" / "tasks"),  # the dataset names the example tasks' repositories
        cwd=tmp_path, timeout_s=170,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "attempt ledger" in proc.stdout

    ledger = json.loads((out / "ledger.json").read_text())
    rows, totals = ledger["rows"], ledger["totals"]
    assert len(rows) == 5
    for column in COLUMNS:
        assert sum(r[column] for r in rows) == totals[column], column
    for status in totals["rejected"]:
        assert sum(r["rejected"].get(status, 0) for r in rows) == totals["rejected"][status]
    assert (totals["tasks"], totals["samples"], totals["sessions"]) == (5, 10, 11)
    assert (totals["empty_retries"], totals["accepted"], totals["rejected"]) == (1, 2, {"unresolved": 8})
    for row in [*rows, totals]:
        assert row["samples"] == row["accepted"] + sum(row["rejected"].values())
        assert row["sessions"] == row["samples"] + row["empty_retries"]
        assert row["attempts"] == row["sessions"] + row["retries"]
    paginate = next(r for r in rows if r["repository"] == "polar-examples/paginate")
    assert (paginate["sessions"], paginate["empty_retries"], paginate["accepted"]) == (3, 1, 2)

    session_rows = read_jsonl(out / "sessions.jsonl")
    assert len(session_rows) == 11
    empty_row = next(r for r in session_rows if r["session_id"] == "paginate-off-by-one-0001")
    assert empty_row["empty"] is True
    assert empty_row["outcome"] == "retried"

    summary = json.loads((out / "summary.json").read_text())
    split = summary["splits"]["polar-examples/paginate"]
    records = read_jsonl(out / "sft" / f"{split}.jsonl")
    assert sorted(r["session_id"] for r in records) == ["paginate-off-by-one-0000", "paginate-off-by-one.retry1-0000"]
    for record in records:
        assert record["repo"] == "polar-examples/paginate"
        assert record["task_id"] == "paginate-off-by-one"
        roles = [m["role"] for m in record["messages"]]
        assert roles[-4:] == ["user", "assistant", "tool", "assistant"]
        assert record["messages"][-1]["content"] == "I fixed page_count: it now rounds up."
        assert {t["function"]["name"] for t in record["tools"]} >= {"bash"}
    other = "validation" if split == "train" else "train"
    assert read_jsonl(out / "sft" / f"{other}.jsonl") == []
    pq = pytest.importorskip("pyarrow.parquet")
    assert pq.read_table(out / "sft" / f"{split}.parquet").num_rows == 2
