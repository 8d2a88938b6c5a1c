"""The processes of one local rollout: run a command in its own process group with a timeout or a
stop event, and find and kill everything the rollout started.

A rollout's processes are found two ways: through its cgroup, which nothing started in it can
leave, where the machine has one; and through the marker variable every command carries in its
environment (MARKER_VAR=<sandbox id>), which survives a child that left its process group. A child
that leaves both (a root agent in plain mode can move itself into the root cgroup and drop its
environment) still cannot leave its command's PID namespace (bubblewrap's, or plain mode's own), so
it dies with the command.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from harness_env.core.errors import SandboxError
from harness_env.core.procs import is_running, kill_process, kill_process_group, pids_with_env
from harness_env.core.sandbox.base import ExecResult, TailBuffer, pump
from harness_env.core.sandbox.cgroups import RolloutCgroup
from harness_env.core.sandbox.envvars import MARKER_VAR
from harness_env.core.sandbox.spawn import SpawnedProcess, spawn


def marked_pids(sandbox_id: str) -> list[int]:
    """PIDs whose environment carries this sandbox's marker."""
    return pids_with_env(MARKER_VAR, sandbox_id)


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


class RolloutProcesses:
    """The commands of one rollout that are running now, and the means to kill all it started."""

    def __init__(self, sandbox_id: str, cgroup: RolloutCgroup | None) -> None:
        self.sandbox_id = sandbox_id
        self.cgroup = cgroup
        self._running: set[SpawnedProcess] = set()

    async def run(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        timeout: float,
        max_output: int,
        on_stdout_line: Callable[[str], None] | None = None,
        stop: asyncio.Event | None = None,
    ) -> ExecResult:
        """Run `argv` in a new session; a timeout, a set `stop` event or cancellation kills its
        whole process group and the output read so far is kept."""
        started = time.monotonic()
        try:
            proc = await spawn(argv, env=env, cwd=cwd)  # starts off the event loop
        except OSError as e:
            raise SandboxError(f"could not start a command in sandbox {self.sandbox_id}: {e}") from e
        self._running.add(proc)
        out, err = TailBuffer(max_output), TailBuffer(max_output)
        assert proc.stdout is not None and proc.stderr is not None
        readers = asyncio.gather(pump(proc.stdout, out, on_stdout_line), pump(proc.stderr, err))
        readers.add_done_callback(_retrieve)  # a cancelled read is expected: no "never retrieved" log
        timed_out = stopped = False
        try:
            waiter = asyncio.ensure_future(proc.wait())
            stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
            try:
                await asyncio.wait({waiter, *([stopper] if stopper else [])}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if stopper is not None:
                    stopper.cancel()
            if not waiter.done():
                stopped = stop is not None and stop.is_set()
                timed_out = not stopped
            # Kill what the command left in its group (background children), then drain pipes.
            kill_process_group(proc.pid)
            if timed_out or stopped:
                await asyncio.to_thread(self.kill_all)
            try:
                await asyncio.wait_for(asyncio.shield(readers), 5)
            except TimeoutError:
                await asyncio.to_thread(self.kill_all)  # an escaped process holds the pipe open
                readers.cancel()
            await proc.wait()
        except BaseException:
            kill_process_group(proc.pid)
            readers.cancel()
            raise
        finally:
            self._running.discard(proc)
        return ExecResult(
            exit_code=None if timed_out or stopped else proc.returncode,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=time.monotonic() - started,
            timed_out=timed_out,
            stopped=stopped,
            stdout_dropped=out.dropped,
            stderr_dropped=err.dropped,
        )

    def kill_all(self) -> int:
        """Kill every process of the rollout: its cgroup's and any carrying its marker (where there
        is no cgroup); returns how many were signalled. Blocking: call it off the event loop."""
        killed = self.cgroup.kill_all() if self.cgroup is not None else 0
        pids = marked_pids(self.sandbox_id)
        for pid in pids:
            kill_process(pid)
        return killed + len(pids)

    async def stop_all(self) -> None:
        """Kill every running command's group and everything else the rollout started, until
        nothing is left (or about 2.5 s have passed), then reap the commands."""
        for proc in list(self._running):
            kill_process_group(proc.pid)
        for _ in range(50):
            if not await asyncio.to_thread(self.kill_all):
                break
            await asyncio.sleep(0.05)
        for proc in list(self._running):
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                pass

    def alive_pids(self, *, with_cgroup: bool = True) -> list[int]:
        """Processes of the rollout still alive (zombies excluded)."""
        pids = set(marked_pids(self.sandbox_id))
        if self.cgroup is not None and with_cgroup:
            pids.update(self.cgroup.pids())
        return [pid for pid in sorted(pids) if is_running(pid)]
