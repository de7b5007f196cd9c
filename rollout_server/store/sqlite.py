"""SQLite backend (aiosqlite): the embedded default, one file, one writer.

The database runs in WAL mode with ``synchronous=NORMAL``: a committed transaction survives a crash of the
process (what a restart needs); only an operating-system crash can lose the last few commits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from rollout_server.store.rows import Row
from rollout_server.store.sql import SqlStore

# The dialect's column types for :func:`~rollout_server.store.sql.schema`.
TYPES = {
    "serial": "INTEGER PRIMARY KEY AUTOINCREMENT",
    "blob": "BLOB",
    "real": "REAL",
    "int": "INTEGER",
}

__all__ = ["TYPES", "SqliteBackend", "open_sqlite_store"]


class _Conn:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        cursor = await self._db.execute(sql, tuple(args))
        count = cursor.rowcount
        await cursor.close()
        return count

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._db.executemany(sql, [tuple(r) for r in rows])

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        cursor = await self._db.execute(sql, tuple(args))
        rows = await cursor.fetchall()
        await cursor.close()
        return list(rows)


class SqliteBackend:
    """One aiosqlite connection; a lock serialises transactions (SQLite has a single writer anyway)."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self.types = dict(TYPES)
        self._db = db
        self._conn = _Conn(db)
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path | str) -> SqliteBackend:
        """Open (creating) the database file at ``path`` (``":memory:"`` for a throwaway one)."""
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        db = await aiosqlite.connect(str(path), isolation_level=None)
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute("PRAGMA synchronous=NORMAL")
        await db.execute("PRAGMA busy_timeout=5000")
        return cls(db)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[_Conn]:
        """A connection inside ``BEGIN IMMEDIATE ... COMMIT``."""
        async with self._lock:
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                await self._db.execute("ROLLBACK")
                raise
            await self._db.execute("COMMIT")

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[_Conn]:
        """The connection, outside any other coroutine's transaction."""
        async with self._lock:
            yield self._conn

    async def close(self) -> None:
        """Close the connection."""
        await self._db.close()


async def open_sqlite_store(path: Path | str) -> SqlStore:
    """Open a SQLite-backed store at ``path`` and create its schema."""
    store = SqlStore(await SqliteBackend.open(path))
    await store.init()
    return store
