"""Restart recovery of the session store: every synced record kept, bad bytes quarantined, never a failed start."""

from __future__ import annotations

import base64
import errno
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from model_proxy.app import ProxyApp
from model_proxy.core import store as store_module
from model_proxy.core.sessions import SessionRegistry
from model_proxy.core.store import SessionStore
from model_proxy.errors import RecordNotWritten
from model_proxy.settings import ProxySettings
from polar_core.records import CompletionRecord


def _record(session_id: str, call_id: str) -> CompletionRecord:
    return CompletionRecord(session_id, call_id, -1, [1, 2, 3], [4], [-0.5], model="policy")


async def _registry(root: Path, *, fsync: bool = False) -> SessionRegistry:
    registry = SessionRegistry(SessionStore(root, fsync=fsync), prefix_cache_entries=1)
    registry.load()
    return registry


async def _write(root: Path, session_id: str, n: int) -> Path:
    registry = await _registry(root)
    session, _ = await registry.open(session_id, "policy")
    for i in range(n):
        await registry.append(session, _record(session_id, f"c{i}"))
    return root / "sessions" / session_id / "completions.jsonl"


def _quarantined(path: Path) -> list[dict[str, Any]]:
    quarantine = path.with_name("completions.jsonl.quarantine")
    return [json.loads(line) for line in quarantine.read_text().splitlines()]


async def test_a_torn_last_line_is_cut_and_every_earlier_record_kept(tmp_path: Path) -> None:
    path = await _write(tmp_path, "s", 3)
    with path.open("ab") as fh:
        fh.write(b'{"session_id":"s","call_id":"c3","se')
    registry = await _registry(tmp_path)
    assert [r.call_id for r in registry.get("s").records] == ["c0", "c1", "c2"]
    assert registry.recovery.torn_tails == 1
    assert registry.recovery.quarantined_lines == 0
    assert path.read_bytes().endswith(b"\n")
    (entry,) = _quarantined(path)
    assert base64.b64decode(entry["bytes_b64"]).startswith(b'{"session_id":"s","call_id":"c3"')
    again = await _registry(tmp_path)
    assert again.recovery.clean
    assert len(again.get("s").records) == 3


async def test_a_bad_middle_line_is_quarantined_and_later_records_kept(tmp_path: Path) -> None:
    path = await _write(tmp_path, "s", 4)
    lines = path.read_bytes().splitlines(keepends=True)
    offset = len(lines[0])
    lines[1] = b"\x00garbage that is not json\n"
    path.write_bytes(b"".join(lines))
    registry = await _registry(tmp_path)
    session = registry.get("s")
    assert [(r.call_id, r.seq) for r in session.records] == [("c0", 0), ("c2", 2), ("c3", 3)]
    assert registry.recovery.quarantined_lines == 1
    (entry,) = _quarantined(path)
    assert entry["offset"] == offset
    assert base64.b64decode(entry["bytes_b64"]) == b"\x00garbage that is not json\n"
    # The next record continues after the last seq, not at the number of records held.
    appended = await registry.append(session, _record("s", "c4"))
    assert appended.seq == 4
    watched = [r.seq async for r in _watch_until(registry, "s", from_seq=1, count=3)]
    assert watched == [2, 3, 4]
    again = await _registry(tmp_path)
    assert again.recovery.clean
    assert [r.seq for r in again.get("s").records] == [0, 2, 3, 4]


async def _watch_until(registry: SessionRegistry, session_id: str, *, from_seq: int, count: int) -> Any:
    seen = 0
    async for record in registry.watch(session_id, from_seq):
        yield record
        seen += 1
        if seen == count:
            return


async def test_a_torn_append_followed_by_a_later_one_keeps_the_later_record(tmp_path: Path) -> None:
    path = await _write(tmp_path, "s", 2)
    lines = path.read_bytes().splitlines(keepends=True)
    # A disk-full append left half of c1's line; the next append (c1 again, say) landed right after it.
    path.write_bytes(lines[0] + lines[1][:40] + lines[1])
    registry = await _registry(tmp_path)
    assert [r.call_id for r in registry.get("s").records] == ["c0", "c1"]
    (entry,) = _quarantined(path)
    assert base64.b64decode(entry["bytes_b64"]) == lines[1][:40]
    assert path.read_bytes() == lines[0] + lines[1]


async def test_a_failed_append_is_cut_back_and_answered_retryable(tmp_path: Path, monkeypatch) -> None:
    registry = await _registry(tmp_path)
    session, _ = await registry.open("s", "policy")
    await registry.append(session, _record("s", "c0"))
    real_write = os.write
    state = {"fail": True}

    def write(fd: int, data: Any) -> int:
        if state["fail"]:
            state["fail"] = False
            real_write(fd, bytes(data[:25]))  # part of the line reaches the disk, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(RecordNotWritten):
        await registry.append(session, _record("s", "lost"))
    await registry.append(session, _record("s", "c1"))
    monkeypatch.undo()
    assert [(r.call_id, r.seq) for r in session.records] == [("c0", 0), ("c1", 1)]
    again = await _registry(tmp_path)
    assert again.recovery.clean
    assert [(r.call_id, r.seq) for r in again.get("s").records] == [("c0", 0), ("c1", 1)]


_OTHER = b'{"session_id": "other", "model": "m", "token_digests": []}'


@pytest.mark.parametrize("content", [b"{not json", b"", b"[]", b'{"session_id": 5}', _OTHER])
async def test_a_corrupt_session_file_is_moved_aside_and_the_proxy_starts(
    tmp_path: Path, tokenizer: Any, backend: Any, content: bytes
) -> None:
    await _write(tmp_path / "proxy", "broken", 2)
    await _write(tmp_path / "proxy", "fine", 1)
    registry = await _registry(tmp_path / "proxy")
    _, _ = await registry.open("empty", "policy")
    (tmp_path / "proxy" / "sessions" / "broken" / "session.json").write_bytes(content)
    (tmp_path / "proxy" / "sessions" / "empty" / "session.json").write_bytes(b"\xff")
    app = ProxyApp(ProxySettings(state_dir=tmp_path, fsync=False, gc_freeze=False), backend, tokenizer)
    await app.start()
    try:
        recovery = app.registry.recovery
        assert sorted(recovery.corrupt_sessions) == ["broken", "empty"]
        assert recovery.restored_closed == ["broken"]
        broken = app.registry.get("broken")
        assert broken.closed
        assert [r.call_id for r in await app.registry.records(broken)] == ["c0", "c1"]
        assert len(app.registry.get("fine").records) == 1
        assert (tmp_path / "proxy" / "sessions" / "broken" / "session.json.corrupt").read_bytes() == content
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{app.http_port}") as client:
            health = (await client.get("/")).json()
        assert health["status"] == "ok"
        assert health["repaired_at_start"]["corrupt_session_files"] == 2
    finally:
        await app.close()
    # The restored session file is valid: the next start is clean and still has the session, closed.
    registry = await _registry(tmp_path / "proxy")
    assert registry.recovery.clean
    assert registry.get("broken").closed


async def test_new_names_are_made_durable_in_their_directory(tmp_path: Path, monkeypatch) -> None:
    synced: list[Path] = []
    monkeypatch.setattr(store_module, "_fsync_dir", synced.append)
    registry = await _registry(tmp_path, fsync=True)
    session, _ = await registry.open("s", "policy")
    root = tmp_path / "sessions"
    assert root in synced  # the new session directory's name
    assert synced[-1] == root / "s"  # session.json renamed into place
    synced.clear()
    await registry.append(session, _record("s", "c0"))
    assert synced == [root / "s"]  # completions.jsonl created
    synced.clear()
    await registry.append(session, _record("s", "c1"))
    assert synced == []  # later appends only fdatasync the file
