from __future__ import annotations

import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from model_proxy.core.events import ReasoningDelta, TextDelta, ToolCallDone
from model_proxy.core.parsing import HermesParser, IncrementalDecoder, StopTrimmer


def _parse(chunks: list[str]):
    stream = HermesParser().stream(lambda i: f"id{i}")
    events = []
    for chunk in chunks:
        events += stream.feed(chunk)
    events += stream.finish()
    return stream.result(), events


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    out, prev = [], 0
    for p in points:
        out.append(text[prev:p])
        prev = p
    return [*out, text[prev:]]


SAMPLE = (
    '<think>\nI should read it.\n</think>\n\nLet me check.\n<tool_call>\n{"name": "read_file", '
    '"arguments": {"path": "a.py"}}\n</tool_call>\n<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>'
)


def test_hermes_splits_reasoning_text_and_tool_calls() -> None:
    parsed, events = _parse([SAMPLE])
    assert parsed.reasoning == "I should read it."
    assert parsed.text == "Let me check."
    assert [(c.id, c.name, c.arguments) for c in parsed.tool_calls] == [
        ("id0", "read_file", {"path": "a.py"}),
        ("id1", "ls", {}),
    ]
    assert not parsed.tool_call_parse_error
    assert [type(e) for e in events][-2:] == [ToolCallDone, ToolCallDone]


def test_unparseable_tool_call_is_returned_as_text_and_flagged() -> None:
    parsed, _ = _parse(["Hi <tool_call>\n{not json}\n</tool_call>"])
    assert parsed.tool_calls == []
    assert parsed.tool_call_parse_error
    assert "<tool_call>\n{not json}\n</tool_call>" in parsed.text


def test_unterminated_tool_call_still_parses_when_json_is_complete() -> None:
    parsed, _ = _parse(['<tool_call>\n{"name": "x", "arguments": {"a": 1}}\n'])
    assert [c.name for c in parsed.tool_calls] == ["x"]
    assert not parsed.tool_call_parse_error


def test_arguments_given_as_json_string_are_decoded() -> None:
    parsed, _ = _parse(['<tool_call>{"name": "x", "arguments": "{\\"a\\": 2}"}</tool_call>'])
    assert parsed.tool_calls[0].arguments == {"a": 2}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_any_chunking_gives_the_same_output(cuts: list[int]) -> None:
    whole, _ = _parse([SAMPLE])
    parsed, events = _parse(_split(SAMPLE, cuts))
    assert parsed == whole
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == whole.text
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == whole.reasoning


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet='ab<>/_ \ntoolcallthink{}"', max_size=80), st.lists(st.integers(0, 80), max_size=6))
def test_parser_never_loses_or_crashes_on_arbitrary_text(text: str, cuts: list[int]) -> None:
    whole, _ = _parse([text])
    parsed, _ = _parse(_split(text, cuts))
    assert parsed == whole


def test_stop_trimmer_cuts_at_first_stop_across_chunks() -> None:
    trim = StopTrimmer(["STOP", "END"])
    out = trim.feed("hello ST") + trim.feed("OP and more") + trim.flush()
    assert out == "hello "
    assert trim.matched == "STOP"


def test_stop_trimmer_without_stops_passes_everything() -> None:
    trim = StopTrimmer([])
    assert trim.feed("abc") + trim.flush() == "abc"
    assert trim.matched is None


# The Qwen2-style tokenizer NFC-normalises its input (as real Qwen2.5 does), so only NFC text round-trips.
@settings(max_examples=60, deadline=None)
@given(st.text(max_size=60).map(lambda s: unicodedata.normalize("NFC", s)), st.integers(1, 5))
def test_incremental_decoder_matches_full_decode(tokenizer, text: str, step: int) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    dec = IncrementalDecoder(tokenizer)
    out = "".join(dec.feed(ids[i : i + step]) for i in range(0, len(ids), step)) + dec.flush()
    assert out == tokenizer.decode(ids, skip_special_tokens=True) == text
