"""PostgreSQL backend (asyncpg): for several rollout hosts sharing one database.

Statements are written with ``?`` placeholders and rewritten to ``$1, $2, ...`` once per distinct statement.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from rollout_server.store.rows import Row
from rollout_server.store.sql import SqlStore

_TYPES = {
    "serial": "BIGSERIAL PRIMARY KEY",
    "blob": "BYTEA",
    "real": "DOUBLE PRECISION",
    "int": "BIGINT",
}

__all__ = ["PostgresBackend", "open_postgres_store"]


def _dollar(sql: str) -> str:
    parts = sql.split("?")
    out = [parts[0]]
    for i, part in enumerate(parts[1:], start=1):
        out.append(f"${i}{part}")
    return "".join(out)


class _Conn:
    def __init__(self, conn: Any, cache: dict[str, str]) -> None:
        self._conn = conn
        self._cache = cache

    def _sql(self, sql: str) -> str:
        converted = self._cache.get(sql)
        if converted is None:
            converted = self._cache[sql] = _dollar(sql)
        return converted

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        status: str = await self._conn.execute(self._sql(sql), *args)
        last = status.rsplit(" ", 1)[-1]
        return int(last) if last.isdigit() else 0

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._conn.executemany(self._sql(sql), [tuple(r) for r in rows])

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        records = await self._conn.fetch(self._sql(sql), *args)
        return [tuple(r) for r in records]


async def _no_reset(conn: Any) -> None:
    """Return a connection to the pool as it is.

    asyncpg's default sends ``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`` on every release: one
    more round trip per store call (10% of the rollout server's CPU at 1,024 active in ``bench/fleet_scale``). This
    store takes no advisory lock, keeps no cursor past a call, never LISTENs and never SETs, so there is nothing
    to reset; asyncpg still rolls back a transaction left open and drops a broken connection.
    """


class PostgresBackend:
    """An asyncpg connection pool."""

    def __init__(self, pool: Any) -> None:
        self.types = dict(_TYPES)
        self._pool = pool
        self._cache: dict[str, str] = {}

    @classmethod
    async def open(cls, dsn: str, *, min_size: int = 1, max_size: int = 8) -> PostgresBackend:
        """Connect a pool to ``dsn`` (``postgresql://user@host:port/db``)."""
        pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, reset=_no_reset)
        return cls(pool)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[_Conn]:
        """A pooled connection inside a transaction."""
        async with self._pool.acquire() as conn, conn.transaction():
            yield _Conn(conn, self._cache)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[_Conn]:
        """A pooled connection in autocommit mode."""
        async with self._pool.acquire() as conn:
            yield _Conn(conn, self._cache)

    async def close(self) -> None:
        """Close the pool."""
        await self._pool.close()


async def open_postgres_store(dsn: str) -> SqlStore:
    """Open a PostgreSQL-backed store and create its schema."""
    store = SqlStore(await PostgresBackend.open(dsn))
    await store.init()
    return store
