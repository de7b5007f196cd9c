"""``polar reconstruct`` through the installed console script, as a user runs it."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from polar_core.export import read_parquet
from polar_core.records import Trace, read_jsonl, write_jsonl
from reconstructor.synthetic import IM_END, SyntheticSpec, synthetic_session
from reconstructor.verify import check_trace

# What the installed ``polar`` script runs (``polar_run.cli:main``), from this checkout.
POLAR = [sys.executable, "-m", "polar_run"]


@pytest.mark.parametrize("strategy", ["per-request", "prefix-merge", "exact"])
def test_polar_reconstruct_end_to_end(tmp_path: Path, strategy: str):
    spec = SyntheticSpec(turns=6, retokenize_prob=0.3, compaction_every=3, subagents=1, parallel_prob=0.3)
    records = synthetic_session(random.Random(11), spec, "sess")
    completions = tmp_path / "completions.jsonl"
    write_jsonl(completions, (r.to_dict() for r in records))
    sessions = tmp_path / "sessions.jsonl"
    write_jsonl(sessions, [{"session_id": "sess", "task_id": "task", "status": "resolved", "reward": 1.0}])
    out, parquet, stats = tmp_path / "traces.jsonl", tmp_path / "traces.parquet", tmp_path / "stats.json"
    common = ["--strategy", strategy, "--end-of-turn-id", str(IM_END), "--sessions", str(sessions)]
    for target, extra in ((out, ["--stats", str(stats)]), (parquet, [])):
        proc = subprocess.run(
            [*POLAR, "reconstruct", str(completions), str(target), *common, *extra],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert f"{strategy}: {len(records)} calls" in proc.stdout
    traces = [Trace.from_dict(r) for r in read_jsonl(out)]
    assert [t.to_dict() for t in read_parquet(parquet)] == [t.to_dict() for t in traces]
    by_id = {r.call_id: r for r in records}
    for t in traces:
        check_trace(t, by_id)
        assert (t.task_id, t.reward, t.status) == ("task", 1.0, "resolved")
    assert sum(t.weight for t in traces) == pytest.approx(1.0)
    summary = json.loads(stats.read_text())
    assert summary["calls"] == len(records)
    assert summary["chains"] == len(traces)
    assert summary["trainable_tokens"] == sum(len(r.response_token_ids) for r in records)
