from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from polar_core.export import read_parquet
from polar_core.model_fixtures import IM_END as IM_END_TEXT
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.records import CompletionRecord, Trace, read_jsonl, write_jsonl
from polar_run.cli import main
from reconstructor.synthetic import IM_END, SyntheticSpec, synthetic_session
from reconstructor.verify import check_trace


def _inputs(tmp_path: Path) -> tuple[Path, Path]:
    rng = random.Random(3)
    records = [r for s in ("a", "b") for r in synthetic_session(rng, SyntheticSpec(turns=4, subagents=1), s)]
    completions = tmp_path / "completions.jsonl"
    write_jsonl(completions, (r.to_dict() for r in records))
    sessions = tmp_path / "sessions.jsonl"
    write_jsonl(
        sessions,
        [
            {"session_id": "a", "task_id": "t", "status": "resolved", "reward": 1.0},
            {"session_id": "b", "task_id": "t", "status": "infra_error", "reward": 0.0},
        ],
    )
    return completions, sessions


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_polar_reconstruct_writes_traces_and_stats(tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture[str]):
    completions, sessions = _inputs(tmp_path)
    out, stats = tmp_path / f"traces{suffix}", tmp_path / "stats.json"
    argv = ["reconstruct", str(completions), str(out), "--end-of-turn-id", str(IM_END), "--sessions", str(sessions)]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--stats", str(stats)])
    assert exit_info.value.code == 0
    traces = read_parquet(out) if suffix == ".parquet" else [Trace.from_dict(r) for r in read_jsonl(out)]
    assert {t.session_id for t in traces} == {"a", "b"}
    assert all(t.task_id == "t" for t in traces)
    assert all(not any(t.loss_mask) for t in traces if t.session_id == "b")
    assert json.loads(stats.read_text())["calls"] == 14
    assert "prefix-merge: 14 calls" in capsys.readouterr().out


def test_bad_sessions_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    completions, sessions = _inputs(tmp_path)
    sessions.write_text('{"session_id": "a", "status": "bogus"}\n')
    with pytest.raises(SystemExit) as exit_info:
        main(["reconstruct", str(completions), str(tmp_path / "o.jsonl"), "--sessions", str(sessions)])
    assert exit_info.value.code == 2
    assert "bad session row" in capsys.readouterr().err


@pytest.mark.parametrize("strategy", ["per-request", "prefix-merge", "exact"])
def test_every_strategy_with_a_tokenizer_directory(tmp_path: Path, strategy: str, capsys: pytest.CaptureFixture[str]):
    tokenizer = build_tiny_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tok")
    eot = tokenizer.convert_tokens_to_ids(IM_END_TEXT)
    assert isinstance(eot, int)
    # The review's hand-worked example, with the tokenizer's own end-of-turn ID.
    records = [
        CompletionRecord("s", "c0", 0, [10], [20], [-0.5], finish_reason="length"),
        CompletionRecord("s", "c1", 1, [10, 21, 22, eot, 30], [40, eot], [-0.25, -0.125]),
    ]
    completions, out = tmp_path / "completions.jsonl", tmp_path / "traces.jsonl"
    write_jsonl(completions, (r.to_dict() for r in records))
    argv = ["reconstruct", str(completions), str(out), "--strategy", strategy, "--tokenizer", str(tmp_path / "tok")]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    traces = [Trace.from_dict(r) for r in read_jsonl(out)]
    for t in traces:
        check_trace(t, {r.call_id: r for r in records})
    if strategy == "prefix-merge":
        (trace,) = traces
        assert trace.response_token_ids == [20, eot, 30, 40, eot]
        assert trace.loss_mask == [1, 0, 0, 1, 1]
        assert trace.exact_context is False
    else:
        assert [t.call_ids for t in traces] == [["c0"], ["c1"]]
        assert all(t.exact_context for t in traces)
    assert f"{strategy}: 2 calls" in capsys.readouterr().out


def test_end_of_turn_flags_are_exclusive(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    completions, _ = _inputs(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["reconstruct", str(completions), str(tmp_path / "o.jsonl"), "--end-of-turn-id", "2", "--tokenizer", "x"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
