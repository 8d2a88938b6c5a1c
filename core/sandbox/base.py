"""The sandbox protocol and the bounded output capture every backend shares."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class ExecResult:
    exit_code: int | None  # None when killed by the timeout
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    stopped: bool = False  # killed because the caller's stop event was set
    stdout_dropped: int = 0  # bytes cut from the head to keep the tail within bounds
    stderr_dropped: int = 0


class TailBuffer:
    """Keeps the last `limit` bytes of a stream and counts what it dropped."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buf = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        self._buf += data
        over = len(self._buf) - self.limit
        if over > 0:
            del self._buf[:over]
            self.dropped += over

    def text(self) -> str:
        body = self._buf.decode("utf-8", errors="replace")
        if self.dropped:
            return f"[... {self.dropped} bytes cut ...]\n" + body
        return body


async def pump(stream: asyncio.StreamReader, buf: TailBuffer, on_line: Callable[[str], None] | None = None) -> None:
    """Read a pipe to EOF into `buf`, calling `on_line` per complete line (for live parsing)."""
    pending = b""
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            break
        buf.feed(chunk)
        if on_line is not None:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                on_line(line.decode("utf-8", errors="replace"))
            if len(pending) > 16 * 1024 * 1024:  # a single runaway line: stop buffering it
                pending = b""
    if on_line is not None and pending:
        on_line(pending.decode("utf-8", errors="replace"))


class Sandbox(Protocol):
    """What the engine and the harnesses need from a sandbox backend. `LocalSandbox` (plain or
    bubblewrap) is one; another backend is one module implementing this plus a SandboxFactory."""

    sandbox_id: str
    backend: str  # "bwrap", "plain", ...: shown in the result
    notes: list[str]  # what the result's sandbox_notes should say (missing isolation, limits)
    workspace: str  # path of the agent's working directory, as seen inside the sandbox
    home: str  # its HOME, as seen inside the sandbox
    reward_file: str  # path of the reward file, as seen inside the sandbox

    @property
    def network_isolated(self) -> bool:
        """True when commands reach nothing but the capture proxy."""
        ...

    def capture_base_url(self, host_url: str) -> str:
        """Where commands in this sandbox reach the capture proxy that the host reaches at `host_url`."""
        ...

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        max_output: int = 1_000_000,
        on_stdout_line: Callable[[str], None] | None = None,
        stop: asyncio.Event | None = None,
        open_network: bool = False,
    ) -> ExecResult:
        """Run a shell line or argv; a timeout, `stop` or cancellation kills everything it started.
        `open_network`: the host's network even where the sandbox cuts it (setup commands)."""
        ...

    def write_file(self, path: str, content: str | bytes) -> None: ...

    def read_file(self, path: str, max_bytes: int = 1_000_000) -> bytes | None: ...

    def collect_files(self) -> dict[str, str]: ...

    def verify_env(self) -> dict[str, str]:
        """Variables verify commands get: the reward file, a fresh home."""
        ...

    def clear_reward_file(self) -> None:
        """Start the verify phase: stop every process of the agent, make the verifier directory
        anew. Blocking: called off the event loop."""
        ...

    def read_reward_file(self) -> str | None: ...

    def limits_hit(self) -> list[str]:
        """The resource limits the rollout ran into, in words."""
        ...

    async def close(self) -> str | None:
        """Kill everything, remove everything; what could not be cleaned up, in words, or None.
        Idempotent; never raises."""
        ...


class SandboxFactory(Protocol):
    """Makes one rollout's sandbox (blocking: called off the event loop). `readonly_paths`: host
    paths the harness needs (its CLI); `limits`: the rollout's Limits; `capture_socket`: the
    proxy's Unix socket, for a sandbox that cuts the network. Optional: `prepare(limits) -> limits`,
    called before the rollout takes a start place (the local factory pulls a task's image there),
    with `release(limits)` for a rollout that ends before its sandbox is made from what prepare
    gave (making the sandbox takes it over), and setupgroups.SharesSetup (one setup per group)."""

    def __call__(self, *, readonly_paths: list[str], limits: Any, capture_socket: str | None) -> Sandbox: ...
