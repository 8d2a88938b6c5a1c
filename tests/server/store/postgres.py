"""A real PostgreSQL server for tests: initdb in a fresh temporary directory, a free port on
loopback, stopped and removed after (nothing left behind). PostgreSQL refuses to run as root, so
as root the server runs as the `postgres` user the Debian package creates (else `nobody`), in a
directory that user owns. `./dev test` installs PostgreSQL (apt); without it a test says how to
install it rather than skipping."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from tests.server_process import free_port

INSTALL = "PostgreSQL is needed for the store tests: apt-get install postgresql (./dev test installs it)"


def bin_dir() -> Path:
    """Where initdb and postgres are: next to pg_ctl on PATH, else Debian's newest
    /usr/lib/postgresql/<version>/bin."""
    candidates = []
    if shutil.which("pg_ctl"):
        candidates.append(Path(os.path.realpath(shutil.which("pg_ctl"))).parent)
    candidates += sorted(
        (Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0, reverse=True
    )
    for d in candidates:
        if (d / "initdb").exists() and (d / "postgres").exists():
            return d
    raise RuntimeError(INSTALL)


def _run_as() -> tuple[int, int] | None:
    if os.getuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pw = pwd.getpwnam(name)
            return pw.pw_uid, pw.pw_gid
        except KeyError:
            continue
    raise RuntimeError("running as root, and neither a postgres nor a nobody user exists to run PostgreSQL as")


class PostgresServer:
    def __init__(self) -> None:
        self.bin = bin_dir()
        self.user = _run_as()
        # Directly in /tmp: the server's user must reach it (pytest's own directories are root's, 0700).
        self.root = Path(tempfile.mkdtemp(prefix="harness-env-pg-", dir="/tmp"))
        if self.user:
            os.chown(self.root, *self.user)
        self.port = free_port()
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._exec("initdb", "-D", str(self.data), "-U", "harness", "--auth=trust", "-E", "UTF8", "--no-sync")
        self.proc = subprocess.Popen(
            [
                str(self.bin / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.root),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
            ],
            stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT,
            **self._user_kw(),
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2):
                    break
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not start: {self.log.read_text()[-2000:]}") from None
                time.sleep(0.1)

    def _user_kw(self) -> dict:
        return {"user": self.user[0], "group": self.user[1], "extra_groups": []} if self.user else {}

    def _exec(self, tool: str, *args: str) -> None:
        out = subprocess.run([str(self.bin / tool), *args], capture_output=True, text=True, **self._user_kw())
        if out.returncode != 0:
            raise RuntimeError(f"{tool} failed: {out.stderr[-2000:]}")

    def url(self, db: str) -> str:
        return f"postgresql://harness@127.0.0.1:{self.port}/{db}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown: disconnect clients, stop
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
