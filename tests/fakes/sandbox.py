"""A second, test-only sandbox backend: a temporary directory and plain processes, written from
the Sandbox protocol alone (no code of LocalSandbox), to show that the engine runs a rollout
through any backend that implements it. Not isolated in any way: tests only."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.base import ExecResult, TailBuffer, pump


class DirSandbox:
    backend = "test-dir"
    network_isolated = False

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sandbox_id = root.name
        self.notes = ["test-only directory sandbox"]
        self.workspace, self.home = str(root / "ws"), str(root / "home")
        self.reward_file = str(root / "verifier" / "reward.txt")
        self.commands: list[str] = []  # what ran, for the test to check
        for sub in ("ws", "home", "verifier"):
            (root / sub).mkdir()

    def capture_base_url(self, host_url: str) -> str:
        return host_url

    async def exec(self, cmd, *, timeout, env=None, cwd=None, max_output=1_000_000, on_stdout_line=None, stop=None, open_network=False) -> ExecResult:
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        self.commands.append(argv[-1])
        full_env = {"PATH": os.environ["PATH"], "HOME": self.home, "LANG": "C.UTF-8", **(env or {})}
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd or self.workspace,
            env=full_env,
            start_new_session=True,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = TailBuffer(max_output), TailBuffer(max_output)
        readers = asyncio.gather(pump(proc.stdout, out, on_stdout_line), pump(proc.stderr, err))
        waits = {asyncio.ensure_future(proc.wait())} | ({asyncio.ensure_future(stop.wait())} if stop else set())
        try:
            done, pending = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                if not w.done():
                    w.cancel()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        await readers
        await proc.wait()
        finished = proc.returncode is not None and not (stop and stop.is_set()) and bool(done)
        stopped = bool(stop and stop.is_set())
        return ExecResult(
            exit_code=proc.returncode if finished else None,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=time.monotonic() - started,
            timed_out=not done,
            stopped=stopped,
        )

    def write_file(self, path: str, content: str | bytes) -> None:
        data = content.encode() if isinstance(content, str) else content
        rel = os.path.relpath(os.path.join(self.workspace, path), self.root)
        safefs.write_regular(self.root, rel, data)

    def read_file(self, path: str, max_bytes: int = 1_000_000) -> bytes | None:
        return safefs.read_regular(self.root, os.path.relpath(os.path.join(self.workspace, path), self.root), max_bytes)

    def collect_files(self) -> dict[str, str]:
        return {f.rel: f.data.decode("utf-8", "replace") for f in safefs.walk_files(self.workspace)}

    def verify_env(self) -> dict[str, str]:
        return {"HARNESS_ENV_REWARD_FILE": self.reward_file}

    def clear_reward_file(self) -> None:
        safefs.remove_tree(self.root / "verifier")
        (self.root / "verifier").mkdir()

    def read_reward_file(self) -> str | None:
        data = safefs.read_regular(self.root, "verifier/reward.txt", 4096)
        return None if data is None else data.decode()

    def limits_hit(self) -> list[str]:
        return []

    async def close(self) -> str | None:
        return safefs.remove_tree(self.root)


@dataclass
class DirSandboxFactory:
    made: list[DirSandbox] = field(default_factory=list)

    def __call__(self, *, readonly_paths: list[str], limits: Any, capture_socket: str | None) -> DirSandbox:
        base = Path(os.environ.get("HARNESS_ENV_SANDBOX_DIR") or tempfile.gettempdir())
        sandbox = DirSandbox(Path(tempfile.mkdtemp(prefix="dir-sandbox-", dir=base)))
        self.made.append(sandbox)
        return sandbox
