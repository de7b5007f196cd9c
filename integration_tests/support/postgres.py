"""A private, throwaway PostgreSQL server for tests and benchmarks (``initdb`` in a temporary directory)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from integration_tests.support.ports import free_port

__all__ = ["PG_BIN", "postgres_available", "private_postgres"]

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def postgres_available() -> bool:
    """Whether the PostgreSQL 15 server binaries are installed."""
    return (PG_BIN / "initdb").exists() and (PG_BIN / "pg_ctl").exists()


@contextlib.contextmanager
def private_postgres() -> Iterator[str]:
    """Start a private PostgreSQL server on a free port and yield its DSN (``postgresql://postgres@.../postgres``).

    As root the server runs as user ``postgres`` (PostgreSQL refuses to run as root); otherwise as the caller.
    """
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    root = Path(tempfile.mkdtemp(prefix="polar-pg-"))
    data = root / "data"
    if as_root:
        shutil.chown(root, "postgres")
    port = free_port()
    run = {"check": True, "stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "timeout": 120}
    try:
        subprocess.run([*prefix, str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"], **run)  # type: ignore[call-overload]
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        subprocess.run(
            [*prefix, str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start"],
            **run,  # type: ignore[call-overload]
        )
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run([*prefix, str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], **run)  # type: ignore[call-overload]
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def fresh_database(dsn: str) -> str:
    """Create an empty database on the server at ``dsn`` and return its DSN (one per test: no shared state)."""
    import uuid

    import asyncpg

    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    return dsn.rsplit("/", 1)[0] + f"/{name}"
