"""Proxy sessions: opened over gRPC, authenticated by token on every HTTP call, holding their records.

Tokens are ``secrets.token_urlsafe(32)``; only their SHA-256 digests are kept on disk, so after a restart the
old tokens still authenticate, and reopening a session returns a fresh token (the old one stays valid).
Sessions are never created implicitly: an unknown or closed token is :class:`UnknownSession`.

Memory stays bounded by the sessions in flight, not by every session ever recorded: a closed session drops its
prefix cache at once, and only the ``closed_in_memory`` most recently closed (or read) sessions keep their
records in memory; the others are *released* and read back from ``completions.jsonl`` when asked for.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import hashlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from opentelemetry.context import Context

from model_proxy.core.body_memo import BodyMemo
from model_proxy.core.render import PrefixCache
from model_proxy.core.store import LineMemo, Recovery, SessionMeta, SessionStore
from model_proxy.core.translation_memo import TranslationMemo
from model_proxy.errors import RecordNotWritten, UnknownSession
from polar_core.errors import FailedPrecondition, InvalidArgument, NotFound
from polar_core.records import CompletionRecord

__all__ = ["Session", "SessionRegistry"]

_log = logging.getLogger(__name__)

# A durable write this fast (moving average of its disk work) may run inline when no other call is in flight.
_INLINE_WRITE_LIMIT_S = 0.002


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclasses.dataclass(eq=False, slots=True)
class Session:
    """One open (or closed) session."""

    meta: SessionMeta
    records: list[CompletionRecord]
    cache: PrefixCache
    token: str | None = None
    in_flight: int = 0
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    write_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    # The trace context of the OpenSession call (the gateway's session trace); every call's span is its child.
    trace_context: Context | None = None
    # Records dropped from memory (closed and not read lately): their number, or -1 while they are held.
    released_count: int = -1
    # The seq of the next record (one past the last one stored; a quarantined line may leave a gap).
    next_seq: int = 0
    # HTTP calls of this session being handled (body read to answer sent): capped by max_calls_per_session.
    http_calls: int = 0
    # Held while a call of this session renders and tokenises (its prefix cache is not shared between threads).
    render_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    # Size of this session's last request body (-1: none yet): a body that grew little since is cheap to prepare.
    last_body_bytes: int = -1
    # The JSON text of the last record's messages and tools, reused by the next record's line.
    line_memo: LineMemo = dataclasses.field(default_factory=LineMemo)
    # The last request's messages and their translation, per protocol (emptied when the session closes).
    translation_memos: dict[str, TranslationMemo] = dataclasses.field(default_factory=dict)
    # The last request body's top-level arrays, text and decoded values (emptied when the session closes).
    body_memo: BodyMemo = dataclasses.field(default_factory=BodyMemo)

    def translation_memo(self, protocol: str) -> TranslationMemo | None:
        """The memo of this session's last ``protocol`` request; None once the session is closed."""
        if self.closed:
            return None
        memo = self.translation_memos.get(protocol)
        if memo is None:
            memo = self.translation_memos[protocol] = TranslationMemo()
        return memo

    def notify(self) -> None:
        """Wake every watcher (each waits on the event current when it last looked)."""
        event, self.wake = self.wake, asyncio.Event()
        event.set()

    @property
    def session_id(self) -> str:
        """The session id."""
        return self.meta.session_id

    @property
    def closed(self) -> bool:
        """Whether the session refuses new calls."""
        return self.meta.closed

    @property
    def record_count(self) -> int:
        """How many completions the session recorded (held in memory or not)."""
        return len(self.records) if self.released_count < 0 else self.released_count


class SessionRegistry:
    """All sessions of this proxy, keyed by id and by token digest."""

    def __init__(
        self,
        store: SessionStore,
        *,
        prefix_cache_entries: int,
        closed_in_memory: int = 8,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """Create an empty registry over ``store``.

        Args:
            store: Where sessions and their records are persisted.
            prefix_cache_entries: Rendered prompts remembered per session (0: off).
            closed_in_memory: Closed sessions whose records stay in memory (the most recently closed or read);
                older ones are read back from disk when asked for.
            clock: Monotonic seconds, timing durable appends for the inline-or-thread choice (tests inject one).
        """
        self._store = store
        self._clock = clock
        self._cache_entries = prefix_cache_entries
        self._by_id: dict[str, Session] = {}
        self._by_digest: dict[str, Session] = {}
        self._closed_in_memory = closed_in_memory
        self._recent_closed: OrderedDict[str, None] = OrderedDict()
        # Moving average of one durable write's disk work (write + fdatasync), seconds: it decides whether a write
        # may block the event loop when nothing else is in flight (see ``append``). Starts pessimistic: threads first.
        self.append_seconds = _INLINE_WRITE_LIMIT_S

    @property
    def recovery(self) -> Recovery:
        """What loading the stored sessions had to repair (see :class:`~model_proxy.core.store.Recovery`)."""
        return self._store.recovery

    def load(self) -> int:
        """Load stored sessions (after a restart); returns how many.

        One session's corrupt files never stop the load: they are quarantined and reported (:attr:`recovery`).
        """
        for stored in self._store.load_all():
            session = Session(stored.meta, stored.records, PrefixCache(self._cache_entries))
            session.next_seq = stored.records[-1].seq + 1 if stored.records else 0
            self._by_id[stored.meta.session_id] = session
            for digest in stored.meta.token_digests:
                self._by_digest[digest] = session
            if session.closed:
                self._touch_closed(session)
        return len(self._by_id)

    async def open(
        self, session_id: str, model: str, *, policy_version: str = "", metadata: Mapping[str, Any] | None = None
    ) -> tuple[Session, str]:
        """Open a session (idempotent while open); returns it and its token.

        Raises:
            InvalidArgument: Empty session id or model.
            FailedPrecondition: The session was closed.
        """
        if not session_id or not model:
            raise InvalidArgument("session_id and model are required")
        session = self._by_id.get(session_id)
        if session is not None:
            if session.closed:
                raise FailedPrecondition(f"session {session_id!r} was closed")
            if session.token is not None:
                return session, session.token
        token = secrets.token_urlsafe(32)
        digest = _digest(token)
        if session is None:
            meta = SessionMeta(session_id, model, [digest], False, policy_version, dict(metadata or {}))
            session = Session(meta, [], PrefixCache(self._cache_entries))
        else:
            session.meta.token_digests.append(digest)
        session.token = token
        await asyncio.to_thread(self._store.save_meta, session.meta)
        self._by_id[session_id] = session
        self._by_digest[digest] = session
        return session, token

    def authenticate(self, token: str | None) -> Session:
        """Return the open session whose token this is.

        Raises:
            UnknownSession: No token, an unknown token, or a closed session's token.
        """
        if not token:
            raise UnknownSession("missing API key: send the session token as the API key")
        session = self._by_digest.get(_digest(token))
        if session is None or session.closed:
            raise UnknownSession("invalid API key: not the token of an open session")
        return session

    def get(self, session_id: str) -> Session:
        """Return a session by id.

        Raises:
            NotFound: Unknown session.
        """
        session = self._by_id.get(session_id)
        if session is None:
            raise NotFound(f"unknown session {session_id!r}")
        return session

    async def close(self, session_id: str) -> Session:
        """Close a session (idempotent); its records stay readable."""
        session = self.get(session_id)
        if not session.closed:
            session.meta.closed = True
            session.token = None
            await asyncio.to_thread(self._store.save_meta, session.meta)
            session.cache = PrefixCache(0)  # no call will extend its prompts again
            session.translation_memos = {}
            session.body_memo.clear()
            self._touch_closed(session)
        session.notify()
        return session

    async def records(self, session: Session) -> list[CompletionRecord]:
        """The session's records in seq order, read back from disk if they were released.

        The list returned stays valid (it is never emptied in place) even if the session is released later.
        """
        if session.released_count >= 0:
            session.records = await asyncio.to_thread(self._store.load_records, session.session_id)
            session.released_count = -1
        if session.closed:
            self._touch_closed(session)
        return session.records

    def _touch_closed(self, session: Session) -> None:
        """Mark ``session`` the most recently used closed session; release the records of the oldest ones."""
        self._recent_closed[session.session_id] = None
        self._recent_closed.move_to_end(session.session_id)
        for _ in range(len(self._recent_closed) - self._closed_in_memory):
            oldest_id, _ = self._recent_closed.popitem(last=False)
            oldest = self._by_id.get(oldest_id)
            if oldest is None or oldest.released_count >= 0:
                continue
            if oldest.in_flight:  # a call still finishing may append: release it on its next use instead
                self._recent_closed[oldest_id] = None
                continue
            oldest.released_count = len(oldest.records)
            oldest.records = []
            oldest.line_memo = LineMemo()

    async def append(
        self, session: Session, record: CompletionRecord, *, prompt_ids_json: str | None = None, alone: bool = False
    ) -> CompletionRecord:
        """Give ``record`` the session's next seq, write it durably, keep it and wake watchers.

        ``prompt_ids_json`` is ``record.prompt_token_ids`` already serialised (comma-separated), if known.
        The line is serialised on the loop (that holds the GIL, so a thread would not free the loop for it);
        its durable write goes to a worker thread, so the event loop serves other calls while the disk works.
        When the caller is ``alone`` (no other call in flight) and the disk work has been fast (moving average
        under ``_INLINE_WRITE_LIMIT_S``), it runs inline instead: blocking an idle loop for a millisecond or so
        costs nobody anything and saves the 0.1-0.3 ms round trip to a thread.
        """
        async with session.write_lock:
            record.seq = session.next_seq
            # Serialising holds the GIL (a thread would not free the loop for it); only the disk work moves.
            line = self._store.line(record, prompt_ids_json, session.line_memo)
            written = False
            try:
                if not self.append_inline(alone=alone):
                    # Shielded: a caller that goes away must not leave a half-written line behind.
                    await asyncio.shield(asyncio.to_thread(self._timed_write, session.session_id, line))
                else:
                    # A page-cache write (fsync off), or a lone call's durable write on a fast disk: inline.
                    self._timed_write(session.session_id, line)
                written = True
            except OSError as exc:
                _log.error("could not write a record of session %r: %s", session.session_id, exc)
                raise RecordNotWritten(f"the completion record could not be written ({exc.strerror})") from None
            finally:
                if not written:  # the record is not (surely) on disk: the next line may not be a delta of it
                    session.line_memo.base_seq = None
            session.next_seq += 1
            session.records.append(record)
        session.notify()
        return record

    def append_inline(self, *, alone: bool) -> bool:
        """Whether the next append may run on the event loop (see :meth:`append`)."""
        return not self._store.blocking or (alone and self.append_seconds < _INLINE_WRITE_LIMIT_S)

    def _timed_write(self, session_id: str, line: bytes) -> None:
        started = self._clock()
        self._store.write_line(session_id, line)
        if self._store.blocking:
            # A lost update between two threads only delays the average a little; no lock needed.
            self.append_seconds += 0.2 * (self._clock() - started - self.append_seconds)

    @staticmethod
    def call_started(session: Session) -> None:
        """Note that a call of ``session`` began."""
        session.in_flight += 1

    @staticmethod
    def call_finished(session: Session) -> None:
        """Note that a call of ``session`` ended (recorded or not); wakes watchers of a closed session."""
        session.in_flight -= 1
        session.notify()

    async def watch(self, session_id: str, from_seq: int) -> AsyncIterator[CompletionRecord]:
        """Yield records from ``from_seq`` on; ends when the session is closed and has no call in flight."""
        session = self.get(session_id)
        records = await self.records(session)
        # Seqs are positions unless a quarantined line left a gap: find the first record at or after from_seq.
        position = bisect.bisect_left(records, max(0, from_seq), key=lambda r: r.seq)
        while True:
            records = await self.records(session)
            while position < len(records):
                yield records[position]
                position += 1
            if session.closed and session.in_flight == 0:
                return
            await session.wake.wait()
