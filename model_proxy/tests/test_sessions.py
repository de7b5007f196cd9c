"""Where a durable append runs: a worker thread, or inline when the call is alone and writes have been fast.

The decision uses the registry's own measurements; the tests inject the clock that takes them, so the disk's
real speed never matters.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from model_proxy.core.sessions import SessionRegistry
from model_proxy.core.store import SessionStore
from polar_core.records import CompletionRecord


class _DiskClock:
    """A clock under which every durable append takes ``write_s`` (the registry reads it before and after)."""

    def __init__(self, write_s: float) -> None:
        self.write_s = write_s
        self._now = 0.0
        self._reads = 0

    def __call__(self) -> float:
        self._reads += 1
        if self._reads % 2 == 0:
            self._now += self.write_s
        return self._now


@pytest.fixture
def threaded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Call ids of the appends that ran in a worker thread."""
    calls: list[str] = []
    real_to_thread = asyncio.to_thread

    async def to_thread(func: Any, *args: Any) -> Any:
        if len(args) == 2 and isinstance(args[1], bytes):  # (session id, the record's line)
            calls.append(json.loads(args[1])["call_id"])
        return await real_to_thread(func, *args)

    monkeypatch.setattr(asyncio, "to_thread", to_thread)  # the module looks it up at each call
    return calls


async def test_durable_appends_leave_the_loop_unless_alone_after_fast_writes(
    tmp_path: Path, threaded: list[str]
) -> None:
    disk = _DiskClock(write_s=0.0001)
    registry = SessionRegistry(SessionStore(tmp_path, fsync=True), prefix_cache_entries=1, clock=disk)
    session, _ = await registry.open("s", "policy")

    async def append(call_id: str, *, alone: bool) -> None:
        await registry.append(session, CompletionRecord("s", call_id, -1, [1, 2], [3], [-0.5]), alone=alone)

    await append("first", alone=True)  # no measurement yet: a thread
    assert registry.append_seconds == pytest.approx(0.002 + 0.2 * (0.0001 - 0.002))
    await append("alone", alone=True)  # measured fast and alone: inline
    await append("busy", alone=False)  # other calls in flight: a thread
    disk.write_s = 0.05  # the disk turns slow (a network disk under load)
    await append("slow", alone=True)  # the average still says fast: inline, and it measures 50 ms
    await append("after", alone=True)  # the average is now far above 2 ms: never block the loop
    assert threaded == ["first", "busy", "after"]
    assert [r.call_id for r in session.records] == ["first", "alone", "busy", "slow", "after"]
    lines = (tmp_path / "sessions").glob("*/completions.jsonl")
    assert sum(len(p.read_text().splitlines()) for p in lines) == 5


async def test_page_cache_appends_always_run_inline(tmp_path: Path, threaded: list[str]) -> None:
    registry = SessionRegistry(
        SessionStore(tmp_path, fsync=False), prefix_cache_entries=1, clock=_DiskClock(write_s=1.0)
    )
    session, _ = await registry.open("t", "policy")
    await registry.append(session, CompletionRecord("t", "c", -1, [1], [2], [-0.1]), alone=False)
    assert threaded == []
    assert registry.append_inline(alone=False)
