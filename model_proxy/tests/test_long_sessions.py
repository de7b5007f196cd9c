"""What grows with a session: ListCompletions pages by bytes, closed sessions' records leave memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from polar.proxy.v1 import model_proxy_service_pb2 as pb

from model_proxy import convert
from model_proxy.core.sessions import SessionRegistry
from model_proxy.core.store import SessionStore
from polar_core.errors import InvalidArgument
from polar_core.records import CompletionRecord


def _record(seq: int, tokens: int) -> CompletionRecord:
    return CompletionRecord("s", f"c{seq}", seq, list(range(tokens)), [7], [-0.5])


def test_list_completions_pages_by_size_as_well_as_count() -> None:
    records = [_record(i, 2000) for i in range(10)]
    one = convert.completions_page_to_proto(records, (0, 100, 1 << 30)).completions[0].ByteSize()
    page = convert.page_from_proto(pb.ListCompletionsRequest(page_size=100, max_page_bytes=3 * one + 10))
    reply = convert.completions_page_to_proto(records, page)
    assert [c.call_id for c in reply.completions] == ["c0", "c1", "c2"]
    assert reply.next_page_token == "3"
    # A record larger than the budget still makes a page of one.
    tiny = convert.page_from_proto(pb.ListCompletionsRequest(page_token="9", max_page_bytes=1))
    last = convert.completions_page_to_proto(records, tiny)
    assert [c.call_id for c in last.completions] == ["c9"]
    assert last.next_page_token == ""
    # The count still applies, and the default budget is 4 MiB.
    assert convert.page_from_proto(pb.ListCompletionsRequest(page_size=2)) == (0, 2, 4 * 1024 * 1024)
    with pytest.raises(InvalidArgument, match="max_page_bytes"):
        convert.page_from_proto(pb.ListCompletionsRequest(max_page_bytes=-1))


async def test_closed_sessions_release_their_records_and_read_them_back(tmp_path: Path) -> None:
    registry = SessionRegistry(SessionStore(tmp_path, fsync=False), prefix_cache_entries=2, closed_in_memory=1)
    sessions = []
    for name in ("a", "b", "c"):
        session, _ = await registry.open(name, "policy")
        for i in range(3):
            await registry.append(session, CompletionRecord(name, f"{name}{i}", -1, [1, 2], [3], [-0.5]))
        sessions.append(session)
    await registry.close("a")
    await registry.close("b")  # a is released: only the last closed session keeps its records
    a, b, c = sessions
    assert a.records == []
    assert a.record_count == 3
    assert len(b.records) == 3
    assert len(c.records) == 3  # open sessions always keep theirs
    again = await registry.records(a)  # read back from disk, and now b is the released one
    assert [r.call_id for r in again] == ["a0", "a1", "a2"]
    assert b.records == []
    assert [r.call_id async for r in registry.watch("b", 1)] == ["b1", "b2"]
