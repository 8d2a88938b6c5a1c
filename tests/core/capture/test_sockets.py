"""The one sweep of capture sockets: a socket is removed only when nobody listens on it and its
lease says the owner is gone (the lease's rule: pid and start time in the same PID namespace, the
deadline in another); a live owner's socket, wherever its owner runs, is never taken."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from harness_env.core.capture import serve, sockets
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.serve import serve_on_unix
from harness_env.core.capture.sockets import SOCKET_PREFIX, sweep_sockets
from harness_env.core.errors import SandboxError
from harness_env.core.procs import process_starttime
from harness_env.core.sandbox import sweep
from harness_env.core.sandbox.lease import Lease, lease_path, own_lease, read_lease, write_lease


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _bound(directory: Path, pid: int, lease: Lease | None) -> Path:
    """A capture socket as a killed owner leaves it: bound, nobody listening, with its lease."""
    path = directory / f"{SOCKET_PREFIX}{pid}-{os.urandom(4).hex()}.sock"
    if lease is not None:
        write_lease(path, lease)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    return path


def _age(path: Path, seconds: float) -> None:
    os.utime(path, (time.time() - seconds,) * 2, follow_symlinks=False)


def test_a_dead_owners_socket_and_lease_go_and_a_live_owners_stay(short_tmp):
    dead = _dead_pid()
    gone = _bound(short_tmp, dead, own_lease().model_copy(update={"pid": dead, "start": "1"}))
    reused = _bound(short_tmp, os.getpid(), own_lease().model_copy(update={"start": "1"}))  # this pid, another process's start
    mine = _bound(short_tmp, os.getpid(), own_lease())  # bound, not yet listening: its owner lives
    (short_tmp / f"{SOCKET_PREFIX}{dead}-not-a-socket.sock").write_text("")
    assert sorted(sweep_sockets(short_tmp)) == sorted([str(gone), str(reused)])
    assert not lease_path(gone).exists() and not lease_path(reused).exists()
    assert mine.exists() and read_lease(lease_path(mine)) is not None
    assert (short_tmp / f"{SOCKET_PREFIX}{dead}-not-a-socket.sock").exists()


def test_an_owner_in_another_pid_namespace_keeps_its_socket_until_its_deadline(short_tmp):
    """Its pid means nothing here (here it names no process, or another): only the deadline can say."""
    dead = _dead_pid()
    elsewhere = _bound(short_tmp, dead, own_lease().model_copy(update={"pid": dead, "pidns": "pid:[1]"}))
    expired = _bound(short_tmp, dead, own_lease().model_copy(update={"pid": dead, "pidns": "pid:[1]", "deadline": time.time() - 1}))
    assert sweep_sockets(short_tmp) == [str(expired)]
    assert elsewhere.exists()


async def test_a_socket_someone_listens_on_is_never_removed(short_tmp):
    """Whatever its lease says (a server outlives any deadline; a lease of another boot): served is alive."""
    path = short_tmp / f"{SOCKET_PREFIX}{_dead_pid()}-0a0b0c0d.sock"
    async with serve_on_unix(CaptureProxy().app, path):
        lease = read_lease(lease_path(path))
        assert lease is not None and lease.pid == os.getpid() and lease.start == process_starttime(os.getpid())
        lease_path(path).unlink()
        write_lease(path, own_lease().model_copy(update={"boot": "another-boot", "deadline": time.time() - 1}))
        assert await asyncio.to_thread(sweep_sockets, short_tmp) == []
        assert path.exists()
    assert not path.exists() and not lease_path(path).exists()  # both removed at exit


def test_a_lease_less_socket_goes_only_once_nobody_has_listened_for_a_while(short_tmp):
    """A socket of a version that wrote no lease: refused connections for over a minute are proof."""
    fresh, old = _bound(short_tmp, os.getpid(), None), _bound(short_tmp, os.getpid(), None)
    _age(old, 3600)
    assert sweep_sockets(short_tmp) == [str(old)]
    assert fresh.exists()


def test_an_orphan_lease_of_a_dead_owner_goes(short_tmp):
    dead = _dead_pid()
    orphan = short_tmp / f"{SOCKET_PREFIX}{dead}-0a0b0c0d.sock"
    write_lease(orphan, own_lease().model_copy(update={"pid": dead, "start": "1"}))
    live = short_tmp / f"{SOCKET_PREFIX}{os.getpid()}-0a0b0c0d.sock"
    write_lease(live)  # written, the socket not bound yet
    assert sweep_sockets(short_tmp) == []
    assert not lease_path(orphan).exists() and lease_path(live).exists()


def test_a_missing_directory_is_nothing_to_sweep(short_tmp):
    assert sweep_sockets(short_tmp / "gone") == []


def test_there_is_one_socket_sweep_and_one_prefix():
    """`run`, `eval`, the app's start and a Ray replica's all go through sweep_at_start's one rule."""
    assert sweep.sweep_sockets is sockets.sweep_sockets
    assert not hasattr(serve, "remove_stale_sockets") and not hasattr(sweep, "SOCKET_PREFIX") and not hasattr(serve, "SOCKET_PREFIX")
    assert os.path.basename(sockets.capture_socket_path()).startswith(SOCKET_PREFIX)


def test_a_temporary_directory_too_long_for_a_socket_is_one_clear_error(monkeypatch):
    long = "/tmp/" + "d" * 80
    monkeypatch.setattr(tempfile, "tempdir", long)
    with pytest.raises(SandboxError, match="too long for the capture proxy's Unix socket.*set TMPDIR to a shorter directory"):
        sockets.capture_socket_path()
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    assert len(sockets.capture_socket_path()) <= sockets.SOCKET_PATH_MAX
