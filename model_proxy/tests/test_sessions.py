"""Where a durable append runs: a worker thread, or inline when the call is alone and the disk is fast."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from model_proxy.core.sessions import SessionRegistry
from model_proxy.core.store import SessionStore
from polar_core.records import CompletionRecord


async def test_durable_appends_leave_the_loop_unless_alone_on_a_fast_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threaded: list[str] = []
    real_to_thread = asyncio.to_thread

    async def to_thread(func: Any, *args: Any) -> Any:
        threaded.append(args[0].call_id if args and isinstance(args[0], CompletionRecord) else "other")
        return await real_to_thread(func, *args)

    monkeypatch.setattr(asyncio, "to_thread", to_thread)  # the module looks it up at each call
    registry = SessionRegistry(SessionStore(tmp_path, fsync=True), prefix_cache_entries=1)
    session, _ = await registry.open("s", "policy")

    async def append(call_id: str, *, alone: bool) -> None:
        record = CompletionRecord("s", call_id, -1, [1, 2], [3], [-0.5])
        await registry.append(session, record, alone=alone)

    await append("first", alone=True)  # no measurement yet: a thread
    assert registry.append_seconds < 0.001  # this disk is fast: the average came down from the 1 ms start
    await append("alone", alone=True)  # inline
    await append("busy", alone=False)  # other calls in flight: a thread
    registry.append_seconds = 0.05  # as after slow writes (a network disk): never block the loop
    await append("slow", alone=True)
    assert [t for t in threaded if t != "other"] == ["first", "busy", "slow"]
    lines = (tmp_path / "sessions").glob("*/completions.jsonl")
    assert [r.call_id for r in session.records] == ["first", "alone", "busy", "slow"]
    assert sum(len(p.read_text().splitlines()) for p in lines) == 4

    fast = SessionRegistry(SessionStore(tmp_path / "nofsync", fsync=False), prefix_cache_entries=1)
    other, _ = await fast.open("t", "policy")
    threaded.clear()
    await fast.append(other, CompletionRecord("t", "c", -1, [1], [2], [-0.1]), alone=False)
    assert [t for t in threaded if t != "other"] == []  # page-cache writes are always inline
