"""Fixtures shared by every test folder; helpers live in tests/support.py."""

from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def postgres_server() -> Iterator["PostgresServer"]:  # noqa: F821
    """One real PostgreSQL server per test worker; tests take databases from it."""
    from tests.postgres import PostgresServer

    server = PostgresServer().start()
    yield server
    server.stop()
