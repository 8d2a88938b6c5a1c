"""A real `harness-env serve` process on a free port (the tests drive it as users would)."""

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import uvicorn


def raw_status(port: int, request: bytes, *, timeout: float = 30, source: str = "127.0.0.1") -> int:
    """Send `request` exactly as written (no client normalises it) and read the status code."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0)) as s:
        s.sendall(request)
        head = b""
        while b"\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
    return int(head.split(b" ", 2)[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(
        self, sandbox_dir: Path, *args: str, env: dict[str, str] | None = None, start_timeout_s: float = 30, stop_timeout_s: float = 15, port: int | None = None
    ) -> None:
        self.stop_timeout_s = stop_timeout_s
        self.port = port or free_port()  # a restart serves on its former port, where clients reconnect
        self.url = f"http://127.0.0.1:{self.port}"
        self.sandbox_dir = sandbox_dir
        # The server's own TMPDIR, so stop() sees every temporary file or directory it leaves.
        self.tmp_dir = sandbox_dir.parent / f"server-{self.port}-tmp"
        self.tmp_dir.mkdir(exist_ok=port is not None)  # a restart finds what its dead former self left there
        # Its own job store unless told (a restart test passes the same one again).
        self.data_dir = Path((env or {}).get("HARNESS_ENV_DATA_DIR") or sandbox_dir.parent / f"server-{self.port}-data")
        full_env = {
            **os.environ,
            "HARNESS_ENV_SANDBOX_DIR": str(sandbox_dir),
            "HARNESS_ENV_LOG_LEVEL": "warning",
            "HARNESS_ENV_DATA_DIR": str(self.data_dir),
            "HARNESS_ENV_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "TMPDIR": str(self.tmp_dir),
            **(env or {}),
        }
        # Output goes to a file: a pipe nobody reads fills up and blocks the server's event loop.
        self.log_path = sandbox_dir.parent / f"server-{self.port}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness_env.cli", "serve", "--port", str(self.port), *args],
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.proc.kill()  # nothing outlives a server that did not start
        self.proc.wait()
        self._log.close()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        raise RuntimeError(f"server did not come up in {start_timeout_s:.0f}s: {self.log_path.read_text()[-3000:]}")

    def assert_no_rollout_left(self, timeout_s: float = 15) -> None:
        """Within `timeout_s`: no rollout running, no rollout directory, no process of one."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            health = httpx.get(self.url + "/health").json()
            if health["rollouts_running"] == 0 and not os.listdir(self.sandbox_dir):
                break
            time.sleep(0.2)
        assert health["rollouts_running"] == 0
        assert os.listdir(self.sandbox_dir) == []
        leftovers = subprocess.run(["pgrep", "-af", str(self.sandbox_dir)], capture_output=True, text=True).stdout
        assert leftovers.strip() == "", leftovers

    def stop(self) -> str:
        """Stop the server; returns what it printed. Fails if it left anything in its TMPDIR.
        Stopping it again (a test, then its fixture) only returns the log."""
        if not self.tmp_dir.exists():
            return self.log_path.read_text()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        left = sorted(p.name for p in self.tmp_dir.iterdir())
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        assert left == [], f"the server left temporary files behind: {left}"
        return self.log_path.read_text()


@asynccontextmanager
async def served_in_process(make_app) -> AsyncIterator[str]:
    """`make_app(url)` served in this process on a loopback port, started and stopped as
    `harness-env serve` does (its lifespan runs); yields the URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(make_app(url), lifespan="on", log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), task.result()
        await asyncio.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        await task
        sock.close()
