"""Delta lines in the session store: a record written as the last one plus what is new reads back exactly."""

from __future__ import annotations

import errno
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from model_proxy.core.sessions import SessionRegistry
from model_proxy.core.store import MAX_DELTA_CHAIN, LineMemo, SessionMeta, SessionStore
from polar_core.errors import InvalidArgument
from polar_core.record_delta import DELTA, TAIL, expand, expand_rows, is_delta
from polar_core.records import CompletionRecord, Trace, read_jsonl, write_jsonl
from polar_run.cli import main
from reconstructor.synthetic import IM_END, SyntheticSpec, synthetic_session

_TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def _record(seq: int, ids: list[int], messages: list[dict[str, Any]], tools: Any = _TOOLS) -> CompletionRecord:
    request: dict[str, Any] = {"model": "m", "messages": messages}
    if tools is not None:
        request["tools"] = tools
    request["max_tokens"] = 64
    return CompletionRecord(
        "s", f"c{seq}", seq, ids, [7, 8], [-0.5, -0.25], model="m", request=request, extra={"backend": "b"}
    )


def _lines(root: Path) -> list[bytes]:
    return (root / "sessions" / "s" / "completions.jsonl").read_bytes().splitlines(keepends=True)


def _store(root: Path) -> SessionStore:
    (root / "sessions" / "s").mkdir(parents=True, exist_ok=True)
    return SessionStore(root, fsync=False)


def _agent_loop(turns: int) -> list[CompletionRecord]:
    """An agent loop's records: each prompt is the last one, its answer and a tool result."""
    rng = random.Random(turns)
    ids = [rng.randrange(50_000) for _ in range(2_000)]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix"}]
    records = []
    for seq in range(turns):
        records.append(_record(seq, list(ids), list(messages)))
        ids += [rng.randrange(50_000) for _ in range(rng.randrange(1, 300))]
        messages += [{"role": "assistant", "content": f"step {seq}"}, {"role": "tool", "content": "ok " * seq}]
    return records


def test_an_agent_loops_records_read_back_exactly_from_a_fraction_of_the_bytes(tmp_path: Path) -> None:
    records = _agent_loop(3 * (MAX_DELTA_CHAIN + 1) + 5)
    store, memo = _store(tmp_path), LineMemo()
    for record in records:  # with the IDs' text, as the renderer gives it
        store.append(record, ",".join(map(str, record.prompt_token_ids)), memo=memo)
    lines = _lines(tmp_path)
    rows = [json.loads(line) for line in lines]
    full = [i for i, row in enumerate(rows) if not is_delta(row)]
    assert full == [0, 32, 64, 96]  # a full line at least every MAX_DELTA_CHAIN + 1
    assert store.load_records("s") == records
    assert list(expand_rows(rows)) == records
    whole = sum(len(json.dumps(r.to_dict(), separators=(",", ":"))) + 1 for r in records)
    assert sum(map(len, lines)) * 5 < whole
    delta = rows[5][DELTA]
    assert delta == {"base_seq": 4, "prompt_token_ids": len(records[4].prompt_token_ids), "messages": 10, "tools": True}
    assert rows[5][TAIL] == records[5].prompt_token_ids[len(records[4].prompt_token_ids) :]
    assert rows[5]["request"]["messages"] == records[5].request["messages"][10:]


def test_a_prompt_that_diverges_shares_its_longest_common_prefix_or_is_written_whole(tmp_path: Path) -> None:
    ids = list(range(1_000, 3_000))
    messages = [{"role": "user", "content": "a"}]
    records = [
        _record(0, ids, messages),
        _record(1, [*ids[:1_500], 9, 9, 9], messages),  # a rewritten tail (a template that drops old thinking)
        _record(2, [*ids[:1_500], 9, 9], [{"role": "user", "content": "b"}], tools=None),  # shorter; no tools
        _record(3, [5, *ids], messages, tools=[]),  # a new first token: nothing in common
        _record(4, [5, *ids, 6], [], tools=[]),
    ]
    store, memo = _store(tmp_path), LineMemo()
    for record in records:
        store.append(record, memo=memo)
    rows = [json.loads(line) for line in _lines(tmp_path)]
    assert [is_delta(row) for row in rows] == [False, True, True, False, True]
    assert rows[1][DELTA]["prompt_token_ids"] == 1_500
    assert rows[2][DELTA] == {"base_seq": 1, "prompt_token_ids": 1_502, "messages": 0, "tools": False}
    assert rows[4][DELTA]["tools"] is True
    assert rows[4]["request"]["tools"] == 0
    assert store.load_records("s") == records


def test_a_failed_write_is_never_the_base_of_a_later_line(tmp_path: Path, monkeypatch) -> None:
    records = _agent_loop(4)
    store, memo = _store(tmp_path), LineMemo()
    store.append(records[0], memo=memo)
    real_write = os.write
    failing = {"on": True}

    def write(fd: int, data: Any) -> int:
        if failing["on"]:
            raise OSError(errno.EIO, "Input/output error")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(OSError, match="Input/output"):
        store.append(records[1], memo=memo)
    failing["on"] = False
    lost = records[1]
    store.append(records[2], memo=memo)  # seq 2: a line of record 1 would be its base, but there is none
    store.append(records[3], memo=memo)
    rows = [json.loads(line) for line in _lines(tmp_path)]
    assert [is_delta(row) for row in rows] == [False, False, True]
    loaded = store.load_records("s")
    assert loaded == [records[0], records[2], records[3]]
    assert lost.call_id not in {r.call_id for r in loaded}


async def test_the_registry_writes_a_full_line_after_a_failed_append(tmp_path: Path, monkeypatch) -> None:
    registry = SessionRegistry(SessionStore(tmp_path, fsync=False), prefix_cache_entries=1)
    registry.load()
    session, _ = await registry.open("s", "m")
    records = _agent_loop(3)
    await registry.append(session, records[0])

    def full_disk(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(Exception, match="could not be written"):
        await registry.append(session, records[1])
    monkeypatch.undo()
    await registry.append(session, records[2])
    rows = [json.loads(line) for line in _lines(tmp_path)]
    assert [is_delta(row) for row in rows] == [False, False]
    again = SessionRegistry(SessionStore(tmp_path, fsync=False), prefix_cache_entries=1)
    again.load()
    assert again.recovery.clean
    assert [r.prompt_token_ids for r in again.get("s").records] == [
        records[0].prompt_token_ids,
        records[2].prompt_token_ids,
    ]


def test_a_bad_line_costs_the_delta_lines_built_on_it_and_no_more(tmp_path: Path) -> None:
    records = _agent_loop(40)
    store, memo = _store(tmp_path), LineMemo()
    store.save_meta(SessionMeta("s", "m", []))
    for record in records:
        store.append(record, memo=memo)
    path = tmp_path / "sessions" / "s" / "completions.jsonl"
    lines = _lines(tmp_path)
    lines[30] = b'{"session_id":"s","garbage\n'  # a delta line whose bytes the disk lost
    path.write_bytes(b"".join(lines))
    again = SessionStore(tmp_path, fsync=False)
    (stored,) = again.load_all()
    assert again.recovery.quarantined_lines == 2
    assert again.load_records("s") == stored.records
    loaded = stored.records
    assert [r.seq for r in loaded] == [*range(30), *range(32, 40)]  # 31 built on 30; 32 is a full line
    assert loaded == records[:30] + records[32:]
    quarantine = (tmp_path / "sessions" / "s" / "completions.jsonl.quarantine").read_text().splitlines()
    reasons = [json.loads(line)["reason"] for line in quarantine]
    assert reasons == ["not a record", "a delta line whose base record is missing"]


def _delta_of(base: CompletionRecord, **change: Any) -> dict[str, Any]:
    row = {"session_id": "s", "call_id": "d", "seq": base.seq + 1, TAIL: [5], "response_token_ids": [1]}
    row |= {"response_logprobs": [-1.0], "request": {"messages": [], "tools": 0}}
    row[DELTA] = {"base_seq": base.seq, "prompt_token_ids": 2, "messages": 1, "tools": True} | change
    return row


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"base_seq": 7}, "base_seq"),
        ({"prompt_token_ids": 4}, "prompt_token_ids must be an integer from 0 to 3"),
        ({"prompt_token_ids": -1}, "prompt_token_ids"),
        ({"prompt_token_ids": True}, "prompt_token_ids"),
        ({"messages": 2}, "messages must be an integer from 0 to 1"),
        ({"tools": 1}, "tools must be a boolean"),
    ],
)
def test_a_malformed_delta_line_is_refused(change: dict[str, Any], message: str) -> None:
    base = _record(0, [1, 2, 3], [{"role": "user", "content": "a"}])
    good = expand(_delta_of(base), base)
    assert good["prompt_token_ids"] == [1, 2, 5]
    assert good["request"] == {"messages": [{"role": "user", "content": "a"}], "tools": _TOOLS}
    with pytest.raises(ValueError, match=message):
        expand(_delta_of(base, **change), base)
    with pytest.raises(InvalidArgument, match="row 2"):
        list(expand_rows([base.to_dict(), _delta_of(base, **change)]))


def test_a_delta_line_needs_its_base_before_it_in_its_own_session() -> None:
    base = _record(0, [1, 2, 3], [{"role": "user", "content": "a"}])
    with pytest.raises(InvalidArgument, match="not before it"):
        list(expand_rows([_delta_of(base), base.to_dict()]))
    with pytest.raises(InvalidArgument, match="not before it"):
        list(expand_rows([base.to_dict(), {**_delta_of(base), "session_id": "other"}]))
    with pytest.raises(InvalidArgument, match="prompt_token_ids"):
        CompletionRecord.from_dict(_delta_of(base))  # a reader that knows no delta lines fails loudly


_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.text(max_size=5)})


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.lists(st.integers(0, 30), max_size=6), st.booleans(), st.booleans()),
        max_size=12,
    )
)
@example([(0, [2], False, True), (1, [23], False, True)])  # "…,2" then "…,23": the text grows, the ID changes
def test_any_sequence_of_prompts_reads_back_exactly(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[int, list[int], bool, bool]]
) -> None:
    """Grow, cut, rewrite (an ID that extends the last one's digits, "2" then "23", included): whatever the
    prompts and messages do, with or without the IDs' text, the records read back are the ones written."""
    root = tmp_path_factory.mktemp("store")
    store, memo = _store(root), LineMemo()
    ids: list[int] = [1, 2, 3, 4]
    messages: list[dict[str, Any]] = []
    records = []
    for seq, (cut, tail, tools, text) in enumerate(steps):
        ids = ids[: max(0, len(ids) - cut)] + tail
        messages = [*messages[: max(0, len(messages) - cut)], {"role": "user", "content": str(tail)}]
        records.append(_record(seq, list(ids), list(messages), _TOOLS if tools else None))
        store.append(records[-1], ",".join(map(str, ids)) if text else None, memo=memo)
    assert store.load_records("s") == records


def test_polar_reconstruct_reads_a_proxys_records_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = synthetic_session(random.Random(5), SyntheticSpec(turns=6, subagents=1), "s")
    for record in records:
        record.request = {"messages": [{"role": "user", "content": f"turn {record.seq}"}]}
    store, memo = _store(tmp_path / "proxy"), LineMemo()
    for record in records:
        store.append(record, memo=memo)
    proxy_file = tmp_path / "proxy" / "sessions" / "s" / "completions.jsonl"
    assert any(is_delta(row) for row in read_jsonl(proxy_file))
    whole = tmp_path / "whole.jsonl"
    write_jsonl(whole, (r.to_dict() for r in records))
    traces = []
    for source in (proxy_file, whole):
        out = tmp_path / f"{source.stem}-traces.jsonl"
        with pytest.raises(SystemExit) as exit_info:
            main(["reconstruct", str(source), str(out), "--end-of-turn-id", str(IM_END)])
        assert exit_info.value.code == 0
        traces.append([Trace.from_dict(row) for row in read_jsonl(out)])
    assert traces[0] == traces[1]
    assert traces[0]
