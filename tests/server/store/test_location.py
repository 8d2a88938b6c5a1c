"""Where the store is, one server per SQLite data directory, and the retention settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness_env.server.jobs.upkeep import Retention, parse_age, parse_size
from harness_env.server.store import DataDirLock, data_dir_problem, default_data_dir, store_url


def test_the_data_directory(tmp_path: Path) -> None:
    space_data = tmp_path / "data"
    assert default_data_dir({"HARNESS_ENV_DATA_DIR": "/srv/x", "SPACE_ID": "a/b"}, space_data) == Path("/srv/x")
    assert default_data_dir({"HOME": "/home/u"}, space_data) == Path("/home/u/.local/share/harness-env/data")
    assert default_data_dir({"HOME": "/home/u", "XDG_DATA_HOME": "/xdg"}, space_data) == Path("/xdg/harness-env/data")
    # A Space's persistent storage, when it has some.
    assert default_data_dir({"HOME": "/home/u", "SPACE_ID": "a/b"}, space_data) == Path("/home/u/.local/share/harness-env/data")
    space_data.mkdir()
    assert default_data_dir({"HOME": "/home/u", "SPACE_ID": "a/b"}, space_data) == space_data / "harness-env"
    assert default_data_dir({"HOME": "/home/u"}, space_data) == Path("/home/u/.local/share/harness-env/data")  # not a Space
    assert store_url(Path("/d"), {}) == "sqlite:////d/rollouts.db"
    assert store_url(Path("/d"), {"HARNESS_ENV_STORE_URL": "postgresql://h/db"}) == "postgresql://h/db"


def test_one_server_per_data_directory(tmp_path: Path) -> None:
    lock = DataDirLock(tmp_path / "new")  # made if missing
    assert "another harness-env server uses the data directory" in (data_dir_problem(tmp_path / "new") or "")
    lock.release()
    assert data_dir_problem(tmp_path / "new") is None
    (tmp_path / "file").write_text("")
    assert "cannot use the data directory" in (data_dir_problem(tmp_path / "file") or "")


def test_retention_settings() -> None:
    assert parse_age("30d") == 30 * 86400 and parse_age("12h") == 43200 and parse_age("90") == 90 and parse_age("0") is None
    assert parse_size("10GB") == 10**10 and parse_size("500 MiB") == 500 * 2**20 and parse_size("none") is None
    for bad in ("10 parsecs", "-1d", "lots"):
        with pytest.raises(ValueError, match="a number with an optional unit"):
            parse_age(bad)
    assert Retention.from_env(env={}) == Retention(None, 10**10, 60.0)  # 10 GB by default, no age limit
    env = {"HARNESS_ENV_RETENTION_MAX_AGE": "7d", "HARNESS_ENV_RETENTION_MAX_SIZE": "1GB", "HARNESS_ENV_RETENTION_INTERVAL_S": "5"}
    assert Retention.from_env(env=env) == Retention(7 * 86400, 10**9, 5.0)
    assert Retention.from_env("1h", "0", env=env) == Retention(3600, None, 5.0)  # flags win
