"""Durable state of the rollout server behind one :class:`Store` protocol (SQLite or PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

from polar_core.errors import InvalidArgument
from rollout_server.store.base import SessionChange, StateCounts, Store
from rollout_server.store.sql import SqlStore

__all__ = ["SessionChange", "SqlStore", "StateCounts", "Store", "open_store"]


async def open_store(url: str, state_dir: Path) -> SqlStore:
    """Open the store named by ``url`` and create its schema.

    Args:
        url: Empty for SQLite at ``state_dir/rollout.sqlite3``; ``sqlite:///PATH`` (or ``sqlite://:memory:``);
            ``postgresql://...`` or ``postgres://...`` for PostgreSQL.
        state_dir: The service's state directory.

    Raises:
        InvalidArgument: For an unknown scheme.
    """
    if not url:
        from rollout_server.store.sqlite import open_sqlite_store

        return await open_sqlite_store(state_dir / "rollout.sqlite3")
    if url.startswith("sqlite://"):
        from rollout_server.store.sqlite import open_sqlite_store

        rest = url.removeprefix("sqlite://")
        return await open_sqlite_store(rest.removeprefix("/") if rest.startswith("/:memory:") else rest or ":memory:")
    if url.startswith(("postgresql://", "postgres://")):
        from rollout_server.store.postgres import open_postgres_store

        return await open_postgres_store(url)
    raise InvalidArgument(f"unsupported store url {url.split(':', 1)[0]!r}; use sqlite:/// or postgresql://")
