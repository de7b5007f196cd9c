from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from integration_tests.otlp import OtlpReceiver
from integration_tests.support.postgres import fresh_database, postgres_available, private_postgres


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """One private PostgreSQL server for the whole run (each test gets its own database)."""
    if not postgres_available():
        pytest.skip("PostgreSQL 15 binaries are not installed")
    with private_postgres() as dsn:
        yield dsn


@pytest.fixture(params=["sqlite", "postgres"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A rollout store URL: a SQLite file, or a fresh database on the private PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'rollout.sqlite3'}"
    return await fresh_database(request.getfixturevalue("pg_server"))
