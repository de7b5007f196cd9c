"""Delta lines: how the proxy stores a completion record as an earlier record of its session plus what is new.

An agent loop resends its whole history on every call, so a session's N-th record repeats the previous one's
prompt IDs and messages: written whole, a 100-turn session of 35k-token calls fills ~25 MB, and each call
waits for ~250 kB to reach the disk. The proxy's ``completions.jsonl`` therefore holds two kinds of lines:

* a **full line**: the record's contract object (``contracts.md``);
* a **delta line**: the same object with three changes, and a last key ``delta``::

      {..., "prompt_token_ids_tail": [ids after the first K], ...,
       "request": {..., "messages": [messages after the first M], "tools": 0, ...}, ...,
       "delta": {"base_seq": B, "prompt_token_ids": K, "messages": M, "tools": true}}

  ``prompt_token_ids_tail`` stands where ``prompt_token_ids`` stood; ``request.tools`` is ``0`` (a
  placeholder, in its place) when ``delta.tools`` says the tools are record ``B``'s. The record is record
  ``B``'s first ``K`` prompt IDs followed by the tail, and record ``B``'s first ``M`` messages followed by the
  line's. Record ``B`` is an earlier line of the same file, full or delta.

A line is a delta line exactly when it has ``delta`` and no ``prompt_token_ids``. A reader that does not know
delta lines fails on one loudly (the record has no ``prompt_token_ids``) rather than reading a tail as a
prompt. Files that ``polar run`` and ListCompletions produce hold full lines only; :func:`expand_rows` reads
either kind.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from polar_core.errors import InvalidArgument
from polar_core.records import CompletionRecord

__all__ = ["DELTA", "TAIL", "TOOLS_PLACEHOLDER", "base_seq", "expand", "expand_rows", "is_delta"]

DELTA = "delta"
TAIL = "prompt_token_ids_tail"
TOOLS_PLACEHOLDER = 0  # request.tools in a delta line whose tools are its base's


def is_delta(data: Mapping[str, Any]) -> bool:
    """Whether ``data`` (one line's object) is a delta line."""
    return DELTA in data and "prompt_token_ids" not in data


def base_seq(data: Mapping[str, Any]) -> int | None:
    """The seq of a delta line's base record (None when ``delta.base_seq`` is not an integer)."""
    delta = data.get(DELTA)
    seq = delta.get("base_seq") if isinstance(delta, dict) else None
    return seq if type(seq) is int else None


def _count(delta: Mapping[str, Any], key: str, limit: int) -> int:
    value = delta.get(key)
    if type(value) is not int or not 0 <= value <= limit:
        raise ValueError(f"delta.{key} must be an integer from 0 to {limit}, not {value!r}")
    return value


def expand(data: Mapping[str, Any], base: CompletionRecord) -> dict[str, Any]:
    """The full record object of the delta line ``data``, whose base record is ``base``.

    Raises:
        ValueError: ``data`` is not a well-formed delta of ``base`` (``base`` is not its ``base_seq``, a count
            exceeds what ``base`` holds, a tail is not a list).
    """
    delta = data[DELTA]
    if not isinstance(delta, dict) or type(delta.get("base_seq")) is not int or delta["base_seq"] != base.seq:
        raise ValueError(f"delta.base_seq must be the base record's seq ({base.seq})")
    if data.get("session_id") != base.session_id:
        raise ValueError("a delta line's base record must be of its session")
    tail = data.get(TAIL)
    request = data.get("request")
    base_messages = base.request.get("messages")
    if not isinstance(tail, list) or not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        raise ValueError(f"a delta line needs {TAIL} and request.messages lists")
    if not isinstance(base_messages, list):
        raise ValueError("the base record has no request.messages list")
    shared_ids = _count(delta, "prompt_token_ids", len(base.prompt_token_ids))
    shared_messages = _count(delta, "messages", len(base_messages))
    tools = delta.get("tools", False)
    if type(tools) is not bool or (tools and ("tools" not in base.request or "tools" not in request)):
        raise ValueError("delta.tools must be a boolean, and true only where both records have tools")
    full_request = dict(request)
    full_request["messages"] = base_messages[:shared_messages] + request["messages"]
    if tools:
        full_request["tools"] = base.request["tools"]
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == TAIL:
            out["prompt_token_ids"] = base.prompt_token_ids[:shared_ids] + tail
        elif key == "request":
            out[key] = full_request
        elif key != DELTA:
            out[key] = value
    return out


def expand_rows(rows: Iterable[Mapping[str, Any]]) -> Iterator[CompletionRecord]:
    """Completion records from line objects, full or delta (the base of a delta line: an earlier row of the same
    session).

    Raises:
        InvalidArgument: A row is not a record, or a delta line's base is not among the earlier rows.
    """
    seen: dict[tuple[str, int], CompletionRecord] = {}
    for index, row in enumerate(rows, 1):
        if is_delta(row):
            session_id, seq = row.get("session_id"), base_seq(row)
            base = seen.get((session_id, seq)) if isinstance(session_id, str) and seq is not None else None
            if base is None:
                raise InvalidArgument(f"row {index}: a delta line whose base record ({seq!r}) is not before it")
            try:
                row = expand(row, base)
            except ValueError as exc:
                raise InvalidArgument(f"row {index}: {exc}") from None
        record = CompletionRecord.from_dict(row)
        seen[(record.session_id, record.seq)] = record
        yield record
