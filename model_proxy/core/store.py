"""Durable per-session storage: ``<state_dir>/sessions/<dir>/session.json`` and ``completions.jsonl``.

Completion records are appended one JSON line each and made durable (``fdatasync``) before the call is
answered, so a restarted proxy loses no finished call. ``session.json`` holds the session's metadata and the
SHA-256 digests of its tokens (never a token itself); it is replaced atomically. A torn last line (a crash
mid-append) is dropped on load.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from polar_core.errors import InvalidArgument
from polar_core.records import CompletionRecord

__all__ = ["SessionMeta", "SessionStore", "StoredSession"]

_log = logging.getLogger(__name__)
_SAFE = re.compile(r"[A-Za-z0-9._-]{1,100}")


@dataclasses.dataclass(slots=True)
class SessionMeta:
    """What is persisted about a session besides its records."""

    session_id: str
    model: str
    token_digests: list[str]
    closed: bool = False
    policy_version: str = ""
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class StoredSession:
    """A session as loaded from disk."""

    meta: SessionMeta
    records: list[CompletionRecord]


def _dirname(session_id: str) -> str:
    if _SAFE.fullmatch(session_id) and session_id not in (".", ".."):
        return session_id
    return "h-" + hashlib.sha256(session_id.encode()).hexdigest()[:40]


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _record_line(record: CompletionRecord, prompt_ids_json: str | None) -> str:
    data = record.to_dict()
    if prompt_ids_json is None:
        return _dumps(data) + "\n"
    head = {key: data.pop(key) for key in ("session_id", "call_id", "seq")}
    del data["prompt_token_ids"]
    return f'{_dumps(head)[:-1]},"prompt_token_ids":[{prompt_ids_json}],{_dumps(data)[1:]}\n'


class SessionStore:
    """Reads and writes session files; blocking methods are meant to run in a worker thread."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self._root = root / "sessions"
        self._fsync = fsync

    @property
    def blocking(self) -> bool:
        """Whether :meth:`append` waits for the disk (fsync), so callers should run it in a worker thread."""
        return self._fsync

    def _dir(self, session_id: str) -> Path:
        return self._root / _dirname(session_id)

    def save_meta(self, meta: SessionMeta) -> None:
        """Write ``session.json`` atomically."""
        directory = self._dir(meta.session_id)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / "session.json.tmp"
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(dataclasses.asdict(meta), fh)
            fh.flush()
            if self._fsync:
                os.fsync(fh.fileno())
        tmp.replace(directory / "session.json")

    def append(self, record: CompletionRecord, prompt_ids_json: str | None = None) -> None:
        """Append one record to its session's ``completions.jsonl`` and make it durable.

        Args:
            record: The record.
            prompt_ids_json: ``record.prompt_token_ids`` as comma-separated decimals, when the caller has them
                (the renderer builds them incrementally; serialising a long prompt again costs milliseconds).
        """
        data = memoryview(_record_line(record, prompt_ids_json).encode("utf-8"))
        path = self._dir(record.session_id) / "completions.jsonl"
        # Plain descriptor calls: no buffered text file object per record. fdatasync makes an append durable
        # (it flushes the data and the file size) without the metadata that reading it back does not need.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            while data:
                data = data[os.write(fd, data) :]
            if self._fsync:
                os.fdatasync(fd)
        finally:
            os.close(fd)

    def load_all(self) -> list[StoredSession]:
        """Load every stored session (records in seq order)."""
        if not self._root.is_dir():
            return []
        out: list[StoredSession] = []
        for directory in sorted(self._root.iterdir()):
            meta_path = directory / "session.json"
            if not meta_path.is_file():
                continue
            meta = SessionMeta(**json.loads(meta_path.read_text(encoding="utf-8")))
            out.append(StoredSession(meta, self._load_records(directory / "completions.jsonl")))
        return out

    def load_records(self, session_id: str) -> list[CompletionRecord]:
        """Read one session's records back (a released session's, see ``SessionRegistry.records``)."""
        return self._load_records(self._dir(session_id) / "completions.jsonl")

    @staticmethod
    def _load_records(path: Path) -> list[CompletionRecord]:
        if not path.is_file():
            return []
        records: list[CompletionRecord] = []
        data = path.read_bytes()
        good = 0
        for raw in data.splitlines(keepends=True):
            if not raw.endswith(b"\n"):
                break
            try:
                records.append(CompletionRecord.from_dict(json.loads(raw)))
            except (ValueError, InvalidArgument):
                break
            good += len(raw)
        if good != len(data):
            _log.warning("dropping a torn record at the end of %s", path)
            with path.open("r+b") as fh:
                fh.truncate(good)
        return records
