"""``polar generate``'s pure parts: the ledger arithmetic, the repository split, SFT records, datasets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from polar_core.errors import InvalidArgument
from polar_run.dataset import (
    LedgerRow,
    SampleOutcome,
    build_ledger,
    is_empty_generation,
    load_dataset,
    sft_record,
    split_of,
    split_repositories,
)
from polar_run.run_generate import write_parquet

REPO = Path(__file__).resolve().parents[2]
_STATUSES = ("resolved", "unresolved", "agent_timeout", "eval_timeout", "invalid_patch", "infra_error", "cancelled")
_COLUMNS = ("tasks", "samples", "sessions", "attempts", "retries", "empty_retries", "accepted")


def _check_identities(row: LedgerRow) -> None:
    assert row.samples == row.accepted + sum(row.rejected.values())
    assert row.sessions == row.samples + row.empty_retries
    assert row.attempts == row.sessions + row.retries


def _check_sums(rows: list[LedgerRow], totals: LedgerRow) -> None:
    for column in _COLUMNS:
        assert sum(getattr(r, column) for r in rows) == getattr(totals, column), column
    for status in {s for r in rows for s in r.rejected} | set(totals.rejected):
        assert sum(r.rejected.get(status, 0) for r in rows) == totals.rejected[status], status


def test_ledger_of_a_small_run() -> None:
    tasks = [("repo-a", "t1", 2), ("repo-a", "t2", 1), ("repo-b", "t3", 2)]
    outcomes = [
        SampleOutcome("repo-a", "t1", "t1-0", "resolved", 1, empty=False, final=True),
        SampleOutcome("repo-a", "t1", "t1-1", "unresolved", 1, empty=True, final=False),  # empty, re-run
        SampleOutcome("repo-a", "t1", "t1.retry1-0", "resolved", 1, empty=False, final=True),
        SampleOutcome("repo-a", "t2", "t2-0", "infra_error", 3, empty=False, final=True),
        SampleOutcome("repo-b", "t3", "t3-0", "agent_timeout", 2, empty=False, final=True),
        SampleOutcome("repo-b", "t3", "t3-1", "unresolved", 1, empty=True, final=True),  # empty, retries used up
    ]
    ledger = build_ledger(tasks, outcomes)
    a, b = ledger.rows
    assert (a.repository, a.tasks, a.samples, a.sessions, a.attempts) == ("repo-a", 2, 3, 4, 6)
    assert (a.retries, a.empty_retries, a.accepted, a.rejected) == (2, 1, 2, {"infra_error": 1})
    assert (b.samples, b.sessions, b.attempts, b.retries, b.accepted) == (2, 2, 3, 1, 0)
    assert b.rejected == {"agent_timeout": 1, "empty": 1}
    for row in [*ledger.rows, ledger.totals]:
        _check_identities(row)
    _check_sums(ledger.rows, ledger.totals)
    data = ledger.to_dict()
    assert data["totals"]["samples"] == 5
    assert data["totals"]["rejected"] == {"agent_timeout": 1, "empty": 1, "infra_error": 1}


def test_ledger_rejects_outcomes_of_unknown_tasks() -> None:
    with pytest.raises(InvalidArgument):
        build_ledger([("r", "t", 1)], [SampleOutcome("r", "x", "x-0", "resolved", 1, empty=False, final=True)])


@st.composite
def _runs(draw: Any) -> tuple[list[tuple[str, str, int]], list[SampleOutcome]]:
    """Random datasets and what ``polar generate`` would record for them."""
    tasks: list[tuple[str, str, int]] = []
    outcomes: list[SampleOutcome] = []
    retries_allowed = draw(st.integers(0, 2))
    for index in range(draw(st.integers(1, 8))):
        repository = f"repo-{draw(st.integers(0, 3))}"
        task_id = f"t{index}"
        samples = draw(st.integers(1, 4))
        tasks.append((repository, task_id, samples))
        for sample in range(samples):
            for attempt in range(retries_allowed + 1):
                status = draw(st.sampled_from(_STATUSES))
                empty = status not in ("infra_error", "cancelled") and draw(st.booleans())
                final = not empty or attempt == retries_allowed
                outcomes.append(
                    SampleOutcome(
                        repository,
                        task_id,
                        f"{task_id}-{sample}-{attempt}",
                        status,
                        draw(st.integers(1, 3)),
                        empty,
                        final,
                    )
                )
                if final:
                    break
    return tasks, outcomes


@settings(max_examples=200, deadline=None)
@given(_runs())
def test_ledger_rows_sum_exactly_to_the_totals(run: tuple[list[tuple[str, str, int]], list[SampleOutcome]]) -> None:
    tasks, outcomes = run
    ledger = build_ledger(tasks, outcomes)
    _check_sums(ledger.rows, ledger.totals)
    for row in [*ledger.rows, ledger.totals]:
        _check_identities(row)
    assert ledger.totals.samples == sum(s for _, _, s in tasks)
    assert ledger.totals.sessions == len(outcomes)


def test_split_is_deterministic_and_keeps_repositories_whole() -> None:
    names = [f"github.com/org/repo{i}" for i in range(200)]
    first = split_repositories(names, 0.1)
    assert first == split_repositories(reversed(names), 0.1)
    assert set(first.values()) == {"train", "validation"}
    validation = sum(1 for v in first.values() if v == "validation")
    assert 5 <= validation <= 40  # about 10 %
    # A repository's split depends on its name alone: adding repositories never moves one.
    more = split_repositories([*names, "another/repo"], 0.1)
    assert all(more[n] == first[n] for n in names)
    assert split_of("x", 0.0) == "train"
    assert split_of("x", 1.0) == "validation"


def test_small_datasets_get_both_splits() -> None:
    splits = split_repositories(["a", "b"], 0.1)
    assert sorted(splits.values()) == ["train", "validation"]
    assert split_repositories(["only"], 0.1) in ({"only": "train"}, {"only": "validation"})
    with pytest.raises(InvalidArgument):
        split_repositories(["a"], 1.5)


def _completion(seq: int, text: str, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"}]
    if seq:
        messages += [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}
                ],
            },
            {"role": "tool", "content": "a.py", "tool_call_id": "c0"},
        ]
    return {
        "seq": seq,
        "request": {"messages": messages, "tools": [{"type": "function", "function": {"name": "bash"}}]},
        "response": {"text": text, "tool_calls": tool_calls or [], "reasoning": None},
    }


def test_sft_record_is_the_last_call_plus_its_answer() -> None:
    calls = [
        _completion(1, "Done."),
        _completion(0, "", [{"id": "c0", "name": "bash", "arguments": {"command": "ls"}}]),
    ]
    record = sft_record(calls, task_id="t", session_id="t-0", repository="r")
    assert record is not None
    assert [m["role"] for m in record["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert record["messages"][2]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
    assert record["messages"][3]["tool_call_id"] == "c0"
    assert record["messages"][-1] == {"role": "assistant", "content": "Done."}
    assert record["tools"] == [{"type": "function", "function": {"name": "bash"}}]
    assert (record["task_id"], record["session_id"], record["repo"]) == ("t", "t-0", "r")
    assert sft_record([], task_id="t", session_id="s", repository="r") is None


def test_empty_generation() -> None:
    assert is_empty_generation([])
    assert is_empty_generation([_completion(0, "  \n")])
    assert not is_empty_generation([_completion(0, "", [{"id": "1", "name": "bash", "arguments": {}}])])
    assert not is_empty_generation([_completion(0, ""), _completion(1, "answer")])


def test_parquet_round_trip(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    calls = [_completion(1, "Done.")]
    records = [sft_record(calls, task_id="t", session_id=f"t-{i}", repository="r") for i in range(2)]
    write_parquet(tmp_path / "train.parquet", [r for r in records if r is not None])
    write_parquet(tmp_path / "empty.parquet", [])
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert [r["session_id"] for r in rows] == ["t-0", "t-1"]
    assert rows[0]["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"command": "ls"}'
    assert json.loads(rows[0]["tools"]) == [{"type": "function", "function": {"name": "bash"}}]
    assert pq.read_table(tmp_path / "empty.parquet").num_rows == 0


def test_the_tiny_dataset_loads() -> None:
    tasks = load_dataset(REPO / "examples" / "datasets" / "tiny")
    assert len(tasks) == 5
    assert len({t.repository for t in tasks}) == 5
    for task in tasks:
        repo = (task.path.parent / task.data["evaluator"]["repo"]).resolve()
        assert repo.is_dir(), repo


def test_dataset_directory_of_task_files(tmp_path: Path) -> None:
    for name, repository in (("a", None), ("b", "org/shared")):
        (tmp_path / name).mkdir()
        data: dict[str, Any] = {"instruction": "x"}
        if repository:
            data["metadata"] = {"repository": repository}
        (tmp_path / name / "task.yaml").write_text(yaml.safe_dump(data))
    tasks = load_dataset(tmp_path)
    assert [(t.task_id, t.repository) for t in tasks] == [("a", "a"), ("b", "org/shared")]


def test_malformed_datasets(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="does not exist"):
        load_dataset(tmp_path / "nope.jsonl")
    with pytest.raises(InvalidArgument, match="neither"):
        load_dataset(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "a"}\nnot json\n')
    with pytest.raises(InvalidArgument, match=":2:"):
        load_dataset(bad)
    twice = tmp_path / "twice.jsonl"
    twice.write_text('{"task_id": "a"}\n{"task_id": "a"}\n')
    with pytest.raises(InvalidArgument, match="twice"):
        load_dataset(twice)
