import pytest


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """The same tests against both backends: a SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'rollouts.db'}"
    return request.getfixturevalue("postgres_server").new_database()
