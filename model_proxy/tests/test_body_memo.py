"""Decoding with a session's body memo gives exactly what a plain strict decode gives (value, types, key order,
or the same error), whatever the next body changed, and reuses the elements whose text is unchanged."""

from __future__ import annotations

import json
import marshal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_proxy.core.body_memo import BodyMemo, decode_with_memo, scanner
from model_proxy.errors import MalformedRequest
from model_proxy.http.body import decode_json

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.sampled_from([*'ab ,]}[{":\\', "\n", "é", "🙂"]), max_size=8),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=12,
)
_SEPARATORS = st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")])


def _outcome(body: bytes, memo: BodyMemo | None) -> tuple[str, Any]:
    try:
        value = decode_json(body, memo)
    except MalformedRequest as exc:
        return "error", str(exc)
    return "value", marshal.dumps(value, 2)  # types and key order included


def _check(body: bytes, memo: BodyMemo) -> None:
    assert _outcome(body, memo) == _outcome(body, None)


@settings(max_examples=150, deadline=None)
@given(
    first=st.lists(_VALUES, max_size=6),
    steps=st.lists(
        st.tuples(st.integers(0, 6), st.lists(_VALUES, max_size=3), st.integers(0, 3), _SEPARATORS), max_size=5
    ),
    extra=st.dictionaries(st.sampled_from(["model", "stream", "tools", "max_tokens"]), _VALUES, max_size=3),
)
def test_a_growing_edited_history_decodes_as_a_plain_decode(
    first: list[Any], steps: list[tuple[int, list[Any], int, tuple[str, str]]], extra: dict[str, Any]
) -> None:
    memo = BodyMemo()
    messages = list(first)
    _check(json.dumps({**extra, "messages": messages}).encode(), memo)
    for keep, added, edit, separators in steps:
        messages = [*messages[: max(keep, len(messages) - 1)], *added]
        if messages and edit:
            messages[min(edit, len(messages)) - 1] = {"edited": edit, "was": messages[min(edit, len(messages)) - 1]}
        _check(json.dumps({"messages": messages, **extra}, separators=separators).encode(), memo)


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3}]}',
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3}], "messages": 5}',  # a repeated key: the last one wins
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3}],}',
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3}]} x',
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3}]',
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3},]}',
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3}] "x": 1}',
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3}], "x": NaN}',
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3}], "x": 1e999}',
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3}], "x": "\\ud800"}',
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3}], "x": "\x01"}',
        b'\xef\xbb\xbf{"messages": [{"a": 1}, {"b": 2}, {"c": 3}]}',
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3}]}\x0c',
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 34}]}',  # the last element's text is a prefix of this one's
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3}, ' + b"[" * 100_000 + b"]" * 100_000 + b"]}",
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3.0}]}',
        b'{"messages": [{"a": 1}, {"b": 2}, {"c": true}]}',
        b'{"messages": [{"a": 1}, {"b": 2}]}',
        b'{"messages": []}',
        b"[1, 2]",
        b"{}",
        b"",
    ],
)
def test_every_body_after_a_known_one_decodes_or_fails_as_a_plain_decode(body: bytes) -> None:
    memo = BodyMemo()
    _check(b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3}]}', memo)
    _check(body, memo)
    _check(b'{"messages": [{"a": 1}, {"b": 2}, {"c": 3}, {"d": 4}]}', memo)  # the memo still works after it


def test_unchanged_elements_are_the_last_bodys_objects() -> None:
    memo = BodyMemo()
    first = decode_json(b'{"tools": [{"t": 1}], "messages": [{"a": 1}, {"b": [2]}]}', memo)
    # Another separator style and a new element; the known elements keep their objects.
    second = decode_json(b'{"messages": [{"a": 1}, {"b": [2]}, {"c": 3}], "tools": [{"t": 1}]}', memo)
    assert [m is n for m, n in zip(second["messages"], first["messages"], strict=False)] == [True, True]
    assert second["tools"][0] is first["tools"][0]
    # A changed element is decoded anew; the ones before it are still reused, after it too if unchanged.
    third = decode_json(b'{"messages": [{"a": 1}, {"b": [2.0]}, {"c": 3}]}', memo)
    assert third["messages"][0] is second["messages"][0]
    assert third["messages"][1] is not second["messages"][1]
    assert third["messages"][1] == {"b": [2.0]}
    assert third["messages"][2] is second["messages"][2]
    assert repr(third["messages"][1]["b"][0]) == "2.0"


@pytest.mark.parametrize(
    "body",
    [
        b'{"stop": [1, 23]}',  # the last element's text is a prefix of the new one's (numbers do not end themselves)
        b'{"stop": [12, 2]}',
        b'{"stop": [1, 2e5]}',
        b'{"stop": [1, 2.5]}',
        b'{"stop": [1, 2, 3]}',
        b'{"stop": [1, 2 ]}',
        b'{"stop": [1]}',
    ],
)
def test_scalar_elements_are_reused_only_when_they_end_where_they_did(body: bytes) -> None:
    memo = BodyMemo()
    _check(b'{"stop": [1, 2]}', memo)
    _check(body, memo)


def test_a_body_of_very_many_items_is_decoded_the_usual_way() -> None:
    """Past a few thousand keys or elements the walk (a Python step each) hands the body to the plain decode."""
    scan = scanner(json.JSONDecoder())
    memo = BodyMemo()
    assert decode_with_memo(json.dumps({"messages": list(range(4000))}), memo, scan) is not None
    for big in ({"messages": list(range(20_000))}, {f"k{i}": i for i in range(20_000)}):
        assert decode_with_memo(json.dumps(big), memo, scan) is None
        _check(json.dumps(big).encode(), memo)  # the same value either way
