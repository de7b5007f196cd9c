from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar_core.errors import InvalidArgument
from polar_core.records import CompletionRecord, TerminalStatus, Trace, read_jsonl, write_jsonl


def _completion(**kw: object) -> CompletionRecord:
    base: dict[str, object] = dict(
        session_id="s", call_id="c1", seq=0, prompt_token_ids=[1, 2], response_token_ids=[3], response_logprobs=[-0.5]
    )
    base.update(kw)
    return CompletionRecord(**base)  # type: ignore[arg-type]


def test_completion_round_trips_and_keeps_unknown_fields() -> None:
    rec = _completion(extra={"future_field": {"a": 1}})
    data = rec.to_dict()
    assert data["future_field"] == {"a": 1}
    assert "extra" not in data
    again = CompletionRecord.from_dict(json.loads(json.dumps(data)))
    assert again == rec


def test_misaligned_logprobs_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="1 response tokens but 2 logprobs"):
        _completion(response_logprobs=[-0.1, -0.2])


def test_missing_field_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="malformed completion record"):
        CompletionRecord.from_dict({"session_id": "s"})


def test_trace_lengths_must_align() -> None:
    with pytest.raises(InvalidArgument, match="lengths differ"):
        Trace("s", "t", 0, ["c"], [1], [2, 3], [1], [0.0, 0.0])


def test_jsonl_round_trip_and_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    assert write_jsonl(path, [_completion().to_dict(), _completion(call_id="c2", seq=1).to_dict()]) == 2
    rows = [CompletionRecord.from_dict(r) for r in read_jsonl(path)]
    assert [r.call_id for r in rows] == ["c1", "c2"]
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(InvalidArgument, match=r"c\.jsonl:3: not JSON"):
        list(read_jsonl(path))


def test_infra_failures_are_not_trainable() -> None:
    assert not TerminalStatus.INFRA_ERROR.trainable
    assert not TerminalStatus.CANCELLED.trainable
    assert TerminalStatus.AGENT_TIMEOUT.trainable
