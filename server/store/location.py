"""Where the store is: a PostgreSQL (or SQLite) URL when one is given, else a SQLite file in the
data directory.

The data directory: --data-dir, else $HARNESS_ENV_DATA_DIR, else on a Hugging Face Space with
persistent storage /data/harness-env, else the user's data directory
($XDG_DATA_HOME/harness-env/data, by default ~/.local/share/harness-env/data).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

DATA_DIR_VAR = "HARNESS_ENV_DATA_DIR"
STORE_URL_VAR = "HARNESS_ENV_STORE_URL"
SPACE_DATA = Path("/data")  # a Space's persistent storage, when it has some
DB_NAME = "rollouts.db"
LOCK_NAME = "server.lock"


def default_data_dir(env: dict[str, str] | None = None, space_data: Path = SPACE_DATA) -> Path:
    env = dict(os.environ) if env is None else env
    if env.get(DATA_DIR_VAR):
        return Path(env[DATA_DIR_VAR]).expanduser()
    if (env.get("SPACE_ID") or env.get("SPACE_HOST")) and space_data.is_dir() and os.access(space_data, os.W_OK):
        return space_data / "harness-env"
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "share")
    return Path(base) / "harness-env" / "data"


def store_url(data_dir: Path, env: dict[str, str] | None = None) -> str:
    """$HARNESS_ENV_STORE_URL, else the SQLite file in `data_dir`."""
    env = dict(os.environ) if env is None else env
    return env.get(STORE_URL_VAR) or f"sqlite:///{data_dir / DB_NAME}"


def store_password(env: dict[str, str] | None = None) -> str | None:
    """The password in $HARNESS_ENV_STORE_URL, if any (masked wherever the server's secrets are)."""
    url = (dict(os.environ) if env is None else env).get(STORE_URL_VAR)
    if not url:
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).password
    except (ArgumentError, ValueError):  # a malformed URL: the store says so when it opens
        return None


class DataDirLock:
    """One server per SQLite data directory: a second one would take the first one's running
    jobs for dead. An flock, released by the kernel when the process dies (kill -9 included)."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = data_dir / LOCK_NAME
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise RuntimeError(
                f"another harness-env server uses the data directory {data_dir}; give this one its own "
                f"(--data-dir or ${DATA_DIR_VAR}), or share a PostgreSQL store (${STORE_URL_VAR})"
            ) from None

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def data_dir_problem(data_dir: Path) -> str | None:
    """Why a server cannot keep its SQLite store in `data_dir` (not writable, another server's),
    in one line, or None; checked before serving so the error is one line, not a traceback."""
    try:
        DataDirLock(data_dir).release()
    except OSError as e:
        return f"cannot use the data directory {data_dir}: {e.strerror or e}; choose another (--data-dir or ${DATA_DIR_VAR})"
    except RuntimeError as e:
        return str(e)
    return None
