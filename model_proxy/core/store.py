"""Durable per-session storage: ``<state_dir>/sessions/<dir>/session.json`` and ``completions.jsonl``.

Completion records are appended one JSON line each and made durable (``fdatasync``) before the call is
answered, so a restarted proxy loses no finished call. A record whose prompt mostly continues the last one's is
written as a delta line of it (:mod:`polar_core.record_delta`; a full line at least every
``MAX_DELTA_CHAIN + 1``), so a session's file grows with what is new in each call, not with its whole history.
``session.json`` holds the session's metadata and the SHA-256 digests of its tokens (never a token itself); it
is replaced atomically. With ``fsync`` on, the
directory is fsync'd too after a file is created or renamed in it, so the new name survives a power cut.

Recovery at start (:meth:`SessionStore.load_all`) keeps every record that was synced:

* An append that fails part-way (disk full, I/O error) is cut back to the file's previous size at once, so it
  never leaves half a line in front of the next append.
* A torn last line (no newline: a crash mid-append, never answered) is cut off.
* A bad complete line anywhere (not a record, or a delta line whose base record is gone) is moved out, and
  reading goes on. If a record follows the bad bytes on the same line (a torn append followed by a later one),
  the record is kept.
* A corrupt ``session.json`` is renamed ``session.json.corrupt``; when the directory holds records, the
  session is restored *closed* (its tokens are lost with the file) so its records stay readable.

Nothing is deleted: removed bytes go, with their offset, to ``completions.jsonl.quarantine`` (one JSON line
each, the bytes base64-encoded), and :attr:`SessionStore.recovery` counts what was done (logged at ERROR).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import marshal
import operator
import os
import re
from pathlib import Path
from typing import Any

from model_proxy.core.prefix_cache import common_prefix_len
from polar_core.errors import InvalidArgument
from polar_core.record_delta import DELTA, TAIL, TOOLS_PLACEHOLDER, base_seq, expand, is_delta
from polar_core.records import CompletionRecord

__all__ = ["LineMemo", "Recovery", "SessionMeta", "SessionStore", "StoredSession"]

_log = logging.getLogger(__name__)
_SAFE = re.compile(r"[A-Za-z0-9._-]{1,100}")
_RECORDS = "completions.jsonl"
_QUARANTINE = "completions.jsonl.quarantine"
_RECORD_START = b'{"session_id":'  # every record line starts so (the record's first field)
MAX_DELTA_CHAIN = 31  # delta lines in a row at most: a full line at least every 32, so a bad line costs few


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
class Recovery:
    """What the last :meth:`SessionStore.load_all` had to repair (all zero on a clean start).

    Attributes:
        corrupt_sessions: Directories whose ``session.json`` was unreadable (renamed ``session.json.corrupt``).
        restored_closed: Of those, the sessions restored closed from their records.
        quarantined_lines: Bad record lines moved to a quarantine file.
        torn_tails: Torn last lines cut off (and kept in the quarantine file).
    """

    corrupt_sessions: list[str] = dataclasses.field(default_factory=list)
    restored_closed: list[str] = dataclasses.field(default_factory=list)
    quarantined_lines: int = 0
    torn_tails: int = 0

    @property
    def clean(self) -> bool:
        """Whether nothing had to be repaired."""
        return not (self.corrupt_sessions or self.quarantined_lines or self.torn_tails)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _parse_meta(raw: bytes) -> SessionMeta:
    """``session.json``'s content; raises ValueError on anything not a well-typed session."""
    data = json.loads(raw.decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError("not an object")
    try:
        meta = SessionMeta(**data)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    fields = (meta.session_id, meta.model, meta.policy_version)
    if not all(isinstance(f, str) for f in fields) or not meta.session_id:
        raise ValueError("session_id, model and policy_version must be strings")
    if not isinstance(meta.token_digests, list) or not all(isinstance(d, str) for d in meta.token_digests):
        raise ValueError("token_digests must be a list of strings")
    if not isinstance(meta.closed, bool) or not isinstance(meta.metadata, dict):
        raise ValueError("closed must be a boolean and metadata an object")
    return meta


_NOT_A_RECORD = "not a record"


def _parse_record(raw: bytes, known: dict[int, CompletionRecord]) -> tuple[CompletionRecord | None, str]:
    """The record of one line (a delta line's base looked up in ``known``, by seq), or None and why not."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or not isinstance(data.get("seq"), int):
            return None, _NOT_A_RECORD
        if is_delta(data):
            seq = base_seq(data)
            base = known.get(seq) if seq is not None else None
            if base is None:
                return None, "a delta line whose base record is missing"
            data = expand(data, base)
        return CompletionRecord.from_dict(data), ""
    except (ValueError, TypeError, AttributeError, InvalidArgument, RecursionError):
        return None, _NOT_A_RECORD


@dataclasses.dataclass(slots=True)
class _Scan:
    records: list[CompletionRecord]
    keep: list[bytes]  # the lines to keep, newline included
    removed: list[tuple[int, str, bytes]]  # (offset, reason, bytes)
    torn: bool


def _scan(data: bytes) -> _Scan:
    """Split a records file into good lines and bad bytes (see the module docstring)."""
    scan = _Scan([], [], [], False)
    known: dict[int, CompletionRecord] = {}  # kept records by seq: the bases of delta lines
    offset = 0
    while offset < len(data):
        end = data.find(b"\n", offset)
        if end < 0:
            scan.removed.append((offset, "torn last line", data[offset:]))
            scan.torn = True
            break
        here, raw, offset = offset, data[offset : end + 1], end + 1
        record, reason = _parse_record(raw, known)
        start = 0
        if record is None:
            start = raw.find(_RECORD_START, 1)
            while start > 0:
                record, _ = _parse_record(raw[start:], known)
                if record is not None:
                    break
                start = raw.find(_RECORD_START, start + 1)
        if record is None:
            scan.removed.append((here, reason, raw))
            continue
        if start > 0:
            scan.removed.append((here, "bytes before a record", raw[:start]))
        scan.records.append(record)
        scan.keep.append(raw[start:])
        known[record.seq] = record
    return scan


@dataclasses.dataclass(slots=True)
class StoredSession:
    """A session as loaded from disk."""

    meta: SessionMeta
    records: list[CompletionRecord]


def _dirname(session_id: str) -> str:
    if _SAFE.fullmatch(session_id) and session_id not in (".", ".."):
        return session_id
    return "h-" + hashlib.sha256(session_id.encode()).hexdigest()[:40]


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)  # json.dumps with these, made once


def _dumps(obj: Any) -> str:
    return _ENCODER.encode(obj)


@dataclasses.dataclass(slots=True)
class LineMemo:
    """The JSON text of one session's last recorded ``request.messages`` and ``request.tools``, for the next line.

    An agent loop resends its whole history and its tools on every call, so a 35k-token call's record repeats
    ~100 messages and every tool schema that the previous line already serialised. A message or the tools list
    reuses its previous text only when that text is certainly what ``json.dumps`` gives now, so the line is
    byte for byte the line written without the memo:

    * a message that is the very dict the previous record held at its place, and a tools list that is the very
      list of the previous record (the renderer hands a session's next call the same dicts for the messages it
      did not translate again, and the same tool list while the tools are equal; they are never changed);
    * messages equal to the previous record's, from the first one on, whose values are all strings (``==`` is
      exact on them);
    * a message with tool calls (whose arguments are free JSON, where ``1 == 1.0 == True``) and the tools (free
      JSON schemas) only when their :func:`marshal` form is the same bytes: marshal writes every value with its
      type, so equal bytes mean equal values of equal types, in the same key order.
    """

    messages: list[Any] = dataclasses.field(default_factory=list)
    texts: list[str] = dataclasses.field(default_factory=list)
    keys: list[bytes | None] = dataclasses.field(default_factory=list)  # marshal forms (tool-call messages only)
    tools: Any = None  # the list tools_text was made for (or checked against); None when the last line had none
    tools_key: bytes | None = None
    tools_text: str = ""
    base_seq: int | None = None  # the last line's record (a delta line's base), None before the first line
    base_ids: list[int] = dataclasses.field(default_factory=list)  # that record's prompt IDs
    base_json: str | None = None  # and their text (comma-separated), when the caller gave it
    chain: int = 0  # delta lines since the last full line


def _exact_key(value: Any) -> bytes | None:
    """``value``'s marshal form (version 2: no back-references, so no refcount shows), or None if it has none."""
    try:
        return marshal.dumps(value, 2)
    except ValueError:  # a type marshal does not write: never reused
        return None


def _shared_prefix(new: list[Any], old: list[Any]) -> int:
    """How many leading items of ``new`` equal those of ``old``."""
    n = len(old)
    if n <= len(new) and new[:n] == old:  # the usual case, compared in C
        return n
    k = 0
    for a, b in zip(new, old, strict=False):
        if a != b:
            break
        k += 1
    return k


def _object_pieces(data: dict[str, Any], given: dict[str, list[str]], out: list[str]) -> None:
    """Append ``data`` as ``_dumps`` would write it to ``out``, in pieces; the values of the keys in ``given``
    are their JSON text, in pieces (joined once, at the end: a line is ~250 kB, and every join copies it)."""
    sep = "{"
    for key, value in data.items():
        out.append(sep + _dumps(key) + ":")
        if key in given:
            out += given[key]
        else:
            out.append(_dumps(value))
        sep = ","
    out.append("}" if sep == "," else "{}")


def _array_pieces(texts: list[str]) -> list[str]:
    """The JSON array of the JSON texts ``texts``, in pieces."""
    out = ["["]
    for i, text in enumerate(texts):
        if i:
            out.append(",")
        out.append(text)
    out.append("]")
    return out


def _message_texts(messages: list[Any], memo: LineMemo) -> tuple[list[str], int]:
    """``messages``' JSON texts, reusing ``memo``'s where exact (and updating it), and how many leading ones are
    exactly the last line's messages (their texts reused: a delta line takes them from its base)."""
    last = memo.messages
    # The usual case first, in C: the last line's messages are the very dicts this call starts with.
    same = len(last) if len(last) <= len(messages) and all(map(operator.is_, messages, last)) else 0
    shared = same or _shared_prefix(messages, last)
    texts, keys = memo.texts[:same], memo.keys[:same]
    exact: int | None = None
    for i in range(same, len(messages)):
        message, key = messages[i], None
        if i < shared and message is memo.messages[i]:  # the very dict (the renderer reuses them; never changed)
            reused, key = True, memo.keys[i]
        elif "tool_calls" not in message:  # its values are strings: == above was exact
            reused = i < shared
        else:
            key = _exact_key(message)
            reused = i < shared and key is not None and key == memo.keys[i]
        texts.append(memo.texts[i] if reused else _dumps(message))
        keys.append(key)
        if not reused and exact is None:
            exact = i
    memo.messages, memo.texts, memo.keys = messages, texts, keys
    return texts, len(messages) if exact is None else exact


def _tools_json(tools: Any, memo: LineMemo) -> tuple[str, bool]:
    """``tools`` as JSON, reusing ``memo``'s text when their marshal form is unchanged (and updating it), and
    whether it is the last line's tools' text."""
    if tools is memo.tools and memo.tools is not None:  # the very list (the renderer reuses it; never changed)
        return memo.tools_text, True
    key = _exact_key(tools)
    same = key is not None and key == memo.tools_key and memo.tools is not None
    if not same:
        memo.tools_key, memo.tools_text = key, _dumps(tools)
    memo.tools = tools
    return memo.tools_text, same


def _shared_ids_json(ids_json: str | None, memo: LineMemo) -> tuple[int, str | None]:
    """When the last prompt's IDs text starts this one's (the usual case: a memcmp, where comparing the lists
    costs a step per ID), the last prompt's length and the text of the IDs after it; else ``(0, None)``."""
    last = memo.base_json
    if ids_json is None or last is None or not ids_json.startswith(last):
        return 0, None
    if len(ids_json) == len(last):
        return len(memo.base_ids), ""
    if not last:
        return 0, ids_json
    if ids_json[len(last)] != ",":  # the last ID continues: "1,2" starts "1,23"
        return 0, None
    return len(memo.base_ids), ids_json[len(last) + 1 :]


def _record_line(record: CompletionRecord, prompt_ids_json: str | None, memo: LineMemo | None = None) -> str:
    data = record.to_dict()
    request = data.get("request")
    if memo is None or not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        if memo is not None:
            memo.base_seq = None  # a line the next one cannot be a delta of
        given: dict[str, list[str]] = {}
        if prompt_ids_json is not None:
            given["prompt_token_ids"] = ["[", prompt_ids_json, "]"]
        if not given:  # nothing known already: one call of the C encoder
            return _dumps(data) + "\n"
        out: list[str] = []
        _object_pieces(data, given, out)
        out.append("\n")
        return "".join(out)
    return _memo_line(record, data, request, prompt_ids_json, memo)


def _memo_line(
    record: CompletionRecord, data: dict[str, Any], request: dict[str, Any], ids_json: str | None, memo: LineMemo
) -> str:
    """A full line, or a delta line of the last line's record (see :mod:`polar_core.record_delta`) when most
    of the prompt is that record's and the chain of delta lines is short enough."""
    texts, same_messages = _message_texts(request["messages"], memo)
    tools_text, same_tools = ("", False)
    if "tools" in request:
        tools_text, same_tools = _tools_json(request["tools"], memo)
    else:
        memo.tools = memo.tools_key = None
    ids = record.prompt_token_ids
    shared, tail_json = _shared_ids_json(ids_json, memo) if memo.base_seq is not None else (0, None)
    if memo.base_seq is not None and tail_json is None:
        shared = common_prefix_len(ids, memo.base_ids)
    delta = (
        memo.base_seq is not None
        and memo.base_seq < record.seq
        and memo.chain < MAX_DELTA_CHAIN
        and 2 * shared >= len(ids) > 0
        and DELTA not in data
        and TAIL not in data
    )
    in_request: dict[str, list[str]] = {}
    given: dict[str, list[str]] = {}
    if delta:
        data = {TAIL if key == "prompt_token_ids" else key: value for key, value in data.items()}
        data[DELTA] = {
            "base_seq": memo.base_seq,
            "prompt_token_ids": shared,
            "messages": same_messages,
            "tools": same_tools,
        }
        given[TAIL] = ["[", tail_json, "]"] if tail_json is not None else [_dumps(ids[shared:])]
        in_request["messages"] = _array_pieces(texts[same_messages:])
        if "tools" in request:
            in_request["tools"] = [str(TOOLS_PLACEHOLDER) if same_tools else tools_text]
    else:
        given["prompt_token_ids"] = ["[", ids_json, "]"] if ids_json is not None else [_dumps(ids)]
        in_request["messages"] = _array_pieces(texts)
        if "tools" in request:
            in_request["tools"] = [tools_text]
    memo.base_seq, memo.base_ids, memo.base_json = record.seq, ids, ids_json
    memo.chain = memo.chain + 1 if delta else 0
    given["request"] = []
    _object_pieces(request, in_request, given["request"])
    out: list[str] = []
    _object_pieces(data, given, out)
    out.append("\n")
    return "".join(out)


class SessionStore:
    """Reads and writes session files; blocking methods are meant to run in a worker thread."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self._root = root / "sessions"
        self._fsync = fsync
        self._known: set[Path] = set()  # record files whose directory entry is known to be durable
        self.recovery = Recovery()

    @property
    def blocking(self) -> bool:
        """Whether :meth:`append` waits for the disk (fsync), so callers should run it in a worker thread."""
        return self._fsync

    def _dir(self, session_id: str) -> Path:
        return self._root / _dirname(session_id)

    def _sync_dir(self, path: Path) -> None:
        if self._fsync:
            _fsync_dir(path)

    def _make_dir(self, directory: Path) -> None:
        """Create a session directory (and the root), each new name made durable in its parent."""
        if directory.is_dir():
            return
        missing = [p for p in (self._root.parent, self._root) if not p.is_dir()]
        directory.mkdir(parents=True, exist_ok=True)
        for path in missing:
            self._sync_dir(path.parent)
        self._sync_dir(self._root)

    def save_meta(self, meta: SessionMeta) -> None:
        """Write ``session.json`` atomically (and durably, with ``fsync`` on: file, then directory)."""
        directory = self._dir(meta.session_id)
        self._make_dir(directory)
        tmp = directory / "session.json.tmp"
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(dataclasses.asdict(meta), fh)
            fh.flush()
            if self._fsync:
                os.fsync(fh.fileno())
        tmp.replace(directory / "session.json")
        self._sync_dir(directory)

    def append(
        self, record: CompletionRecord, prompt_ids_json: str | None = None, memo: LineMemo | None = None
    ) -> None:
        """Append one record to its session's ``completions.jsonl`` and make it durable.

        :meth:`line` then :meth:`write_line`.

        Raises:
            OSError: The record could not be written (nothing of it is left in the file, if the disk allows).
        """
        line = self.line(record, prompt_ids_json, memo)
        try:
            self.write_line(record.session_id, line)
        except OSError:
            if memo is not None:
                memo.base_seq = None  # the record is not on disk: the next line may not be a delta of it
            raise

    @staticmethod
    def line(record: CompletionRecord, prompt_ids_json: str | None = None, memo: LineMemo | None = None) -> bytes:
        """The record's line (UTF-8, newline included): CPU work that holds the GIL, so callers keep it on the loop.

        Args:
            record: The record.
            prompt_ids_json: ``record.prompt_token_ids`` as comma-separated decimals, when the caller has them
                (the renderer builds them incrementally; serialising a long prompt again costs milliseconds).
            memo: The session's :class:`LineMemo` (updated): what its last line serialised is not serialised again,
                and the line is a delta line of the last line's record when most of its prompt is that record's
                (:mod:`polar_core.record_delta`). When the line is not written, set ``memo.base_seq`` to None.
        """
        return _record_line(record, prompt_ids_json, memo).encode("utf-8")

    def write_line(self, session_id: str, line: bytes) -> None:
        """Append ``line`` (from :meth:`line`) to the session's ``completions.jsonl`` and make it durable.

        The disk work (``write``, ``fdatasync``) releases the GIL: this is what callers send to a worker thread.
        An append that fails part-way is cut back to the file's previous size before the error propagates, so
        the file never holds half a line in front of a later record.

        Raises:
            OSError: The line could not be written (nothing of it is left in the file, if the disk allows).
        """
        data = memoryview(line)
        path = self._dir(session_id) / _RECORDS
        # Plain descriptor calls: no buffered text file object per record. fdatasync makes an append durable
        # (it flushes the data and the file size) without the metadata that reading it back does not need.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                while data:
                    data = data[os.write(fd, data) :]
                if self._fsync:
                    os.fdatasync(fd)
            except OSError:
                self._cut_back(fd, path, size)
                raise
        finally:
            os.close(fd)
        if path not in self._known:
            self._sync_dir(path.parent)  # the file may be new: make its name durable once
            self._known.add(path)

    @staticmethod
    def _cut_back(fd: int, path: Path, size: int) -> None:
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            _log.error("could not cut a failed append back out of %s: %s (recovered at the next start)", path, exc)

    def load_all(self) -> list[StoredSession]:
        """Load every stored session (records in seq order), repairing what a crash or a bad disk left.

        Never fails because of one session's files: see the module docstring; :attr:`recovery` says what was done.
        """
        self.recovery = Recovery()
        if not self._root.is_dir():
            return []
        out: list[StoredSession] = []
        for directory in sorted(self._root.iterdir()):
            meta_path = directory / "session.json"
            if not directory.is_dir() or not meta_path.is_file():
                continue
            records = self._load_records(directory / _RECORDS, repair=True)
            try:
                meta = _parse_meta(meta_path.read_bytes())
                if _dirname(meta.session_id) != directory.name:
                    raise ValueError(f"it names session {meta.session_id!r}, not this directory's")
            except (OSError, ValueError) as exc:
                restored = self._quarantine_meta(directory, records, exc)
                if restored is None:
                    continue
                meta = restored
            self._known.add(directory / _RECORDS)
            out.append(StoredSession(meta, records))
        return out

    def _quarantine_meta(self, directory: Path, records: list[CompletionRecord], exc: Exception) -> SessionMeta | None:
        """Move a corrupt ``session.json`` aside; restore the session closed when its records name it."""
        meta_path = directory / "session.json"
        moved = meta_path.with_name("session.json.corrupt")
        meta_path.replace(moved)
        self._sync_dir(directory)
        self.recovery.corrupt_sessions.append(directory.name)
        ids = {r.session_id for r in records}
        if len(ids) != 1 or _dirname(records[0].session_id) != directory.name:
            _log.error("session file %s is corrupt (%s): moved to %s; no session restored", meta_path, exc, moved)
            return None
        meta = SessionMeta(
            records[0].session_id,
            records[-1].model,
            [],
            closed=True,
            policy_version=records[-1].policy_version,
            metadata={"recovered": "session.json was corrupt; restored closed from its records"},
        )
        self.save_meta(meta)
        self.recovery.restored_closed.append(meta.session_id)
        _log.error(
            "session file %s is corrupt (%s): moved to %s; session %r restored closed with its %d records "
            "(its tokens are lost)",
            meta_path,
            exc,
            moved,
            meta.session_id,
            len(records),
        )
        return meta

    def load_records(self, session_id: str) -> list[CompletionRecord]:
        """Read one session's records back (a released session's, see ``SessionRegistry.records``).

        Bad lines are skipped (and logged), not repaired: the files are repaired at start only.
        """
        return self._load_records(self._dir(session_id) / _RECORDS, repair=False)

    def _load_records(self, path: Path, *, repair: bool) -> list[CompletionRecord]:
        if not path.is_file():
            return []
        scan = _scan(path.read_bytes())
        if scan.removed and not repair:
            _log.error("skipping %d bad record lines in %s", len(scan.removed), path)
        elif scan.removed:
            self._repair(path, scan)
        return scan.records

    def _repair(self, path: Path, scan: _Scan) -> None:
        """Quarantine the removed bytes (durably), then rewrite ``path`` to the kept lines."""
        quarantine = path.with_name(_QUARANTINE)
        lines = [
            _dumps({"offset": offset, "reason": reason, "bytes_b64": base64.b64encode(raw).decode("ascii")}) + "\n"
            for offset, reason, raw in scan.removed
        ]
        with quarantine.open("a", encoding="utf-8") as fh:
            fh.writelines(lines)
            fh.flush()
            if self._fsync:
                os.fsync(fh.fileno())
        bad = sum(1 for _, reason, _ in scan.removed if reason != "torn last line")
        self.recovery.quarantined_lines += bad
        self.recovery.torn_tails += int(scan.torn)
        if bad:
            tmp = path.with_name(_RECORDS + ".tmp")
            with tmp.open("wb") as out:
                out.writelines(scan.keep)
                out.flush()
                if self._fsync:
                    os.fsync(out.fileno())
            tmp.replace(path)
        else:  # only a torn tail: cut it off in place
            with path.open("r+b") as fh:
                fh.truncate(sum(len(line) for line in scan.keep))
                if self._fsync:
                    os.fsync(fh.fileno())
        self._sync_dir(path.parent)
        _log.log(
            logging.ERROR if bad else logging.WARNING,
            "%s: %d bad lines quarantined, %d torn last line cut off, %d records kept (removed bytes in %s)",
            path,
            bad,
            int(scan.torn),
            len(scan.records),
            quarantine,
        )
