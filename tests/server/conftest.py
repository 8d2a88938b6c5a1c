import pytest

from tests.server.store.postgres import PostgresServer


@pytest.fixture(scope="session")
def postgres_server():
    """One real PostgreSQL server for the session (a fresh database per test: new_database())."""
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()
        assert not server.root.exists(), "PostgreSQL's directory was left behind"
