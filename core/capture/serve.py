"""Run an ASGI app (the capture proxy) on a socket of its own, inside the current loop.

`harness-env run` and in-process use need the proxy without the full server: an ephemeral loopback
port. A sandbox with its own network namespace reaches the proxy through a Unix socket bound into
it (the sandbox forwards a loopback port of its own to it), so through it only the proxy's routes
are reachable, never the server's API. The server also mounts the same app under its own prefix.
Every listener started here bounds its connections (core/capture/listener.py): a sandbox can open
as many as it likes through its socat, and must not take the server's file descriptors.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import logging
import os
import socket
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn

from harness_env.core.capture.listener import ConnectionBounds, bounded_protocol, process_bounds
from harness_env.core.capture.sockets import listening
from harness_env.core.sandbox.lease import lease_path, write_lease

# sun_path holds 108 bytes on Linux, with the terminating NUL
MAX_UNIX_PATH_BYTES = 107


# Set in an embedded server's task: uvicorn logs its start and stop lines ("Started server process
# [pid]", "Shutting down", ...) on the module logger its owner uses too, where they read as the
# process's own, once per listener. Its warnings and errors still go through.
_IN_EMBEDDED = contextvars.ContextVar("harness_env_embedded_uvicorn", default=False)


class _EmbeddedNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not _IN_EMBEDDED.get()


logging.getLogger("uvicorn.error").addFilter(_EmbeddedNotices())  # uvicorn's logging configuration keeps a logger's filters


async def _serve_embedded(server: uvicorn.Server, sock: socket.socket) -> None:
    _IN_EMBEDDED.set(True)  # this task's context only
    await server.serve(sockets=[sock])


class _EmbeddedConfig(uvicorn.Config):
    def configure_logging(self) -> None:
        """Nothing: uvicorn's own would reset the process's uvicorn loggers (access_log=False
        empties uvicorn.access for everyone, silencing the app server's access log)."""


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server inside someone else's process (the CLI, or the app's own uvicorn): it
    leaves signals and logging to its owner."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@asynccontextmanager
async def _serving(app: Any, sock: socket.socket, bounds: ConnectionBounds | None) -> AsyncIterator[None]:
    """Serve `app` on the bound socket `sock` until the block ends; the one way uvicorn is started.
    Its connections are bounded (core/capture/listener.py): per peer, in all, and in idle time."""
    bounds = bounds or process_bounds()  # one per process: every listener's connections count in one total
    config = _EmbeddedConfig(app, lifespan="off", access_log=False, timeout_keep_alive=int(bounds.idle_timeout_s), http=bounded_protocol(bounds))
    server = _EmbeddedServer(config)
    task = asyncio.create_task(_serve_embedded(server, sock))
    try:
        while not server.started:
            if task.done():
                task.result()  # surfaces the start-up error
            await asyncio.sleep(0.01)
        yield
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(task, 10)
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()
        sock.close()


@asynccontextmanager
async def serve_on_loopback(app: Any, host: str = "127.0.0.1", bounds: ConnectionBounds | None = None) -> AsyncIterator[str]:
    """Yield `http://host:port` while `app` serves there."""
    # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets of that proto,
    # and without it every response waits ~40 ms for a delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    port = sock.getsockname()[1]
    async with _serving(app, sock, bounds):
        yield f"http://{host}:{port}"


def _remove_stale_socket(path: Path) -> None:
    """A socket file (and its lease) left at `path` by a process that died is removed; anything
    else at `path` (a live socket, a file, a link) is never replaced."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(errno.EEXIST, "not a socket; refusing to replace it", str(path))
    if listening(path):
        raise FileExistsError(errno.EADDRINUSE, "a server already listens on this socket", str(path))
    path.unlink(missing_ok=True)
    lease_path(path).unlink(missing_ok=True)


@asynccontextmanager
async def serve_on_unix(app: Any, path: str | os.PathLike[str], bounds: ConnectionBounds | None = None) -> AsyncIterator[str]:
    """Yield the socket path while `app` serves on a Unix socket there.

    The socket file is mode 0o666 (a sandbox's unprivileged uid must be able to connect; who can
    reach it is decided by where it is bound, i.e. the directory's permissions and the sandbox's
    mounts) and is removed at exit. A lease beside it (`<path>.lease`, written before the bind,
    removed after the socket) names this process as its owner, so a later start's sweep
    (core/capture/sockets.py) never takes a live socket. The directory must exist.
    """
    path = Path(path)
    if len(os.fsencode(path)) > MAX_UNIX_PATH_BYTES:
        raise ValueError(f"Unix socket path over {MAX_UNIX_PATH_BYTES} bytes: {path}; use a shorter directory")
    _remove_stale_socket(path)
    write_lease(path)
    try:
        async with _bound_unix(path) as sock, _serving(app, sock, bounds):
            yield str(path)
    finally:
        lease_path(path).unlink(missing_ok=True)


@asynccontextmanager
async def _bound_unix(path: Path) -> AsyncIterator[socket.socket]:
    """A Unix socket bound at `path`, mode 0o666; its file removed at exit if still ours."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
    except OSError:
        sock.close()
        raise
    try:
        bound = path.lstat()
        os.chmod(path, 0o666)
    except OSError:
        sock.close()
        path.unlink(missing_ok=True)
        raise
    try:
        yield sock
    finally:
        sock.close()
        try:
            st = path.lstat()
            if (st.st_dev, st.st_ino) == (bound.st_dev, bound.st_ino):  # still ours, not a replacement
                path.unlink()
        except FileNotFoundError:
            pass
