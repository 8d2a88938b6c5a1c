"""Starting a sandbox command without holding the event loop.

asyncio's create_subprocess_exec forks on the event loop and then waits there until the child has
run its preexec function (rlimits, joining the rollout's cgroup) and exec'd: tens of milliseconds
per command in a server of a few hundred MB, during which no other rollout's I/O moves. With
hundreds of rollouts each running a command per tool call, that was most of the loop's lag. Here
the fork and exec happen in a worker thread; the pipes are then read by the loop, and a
thread per command waits for its exit.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Callable

from harness_env.core.procs import kill_process_group


class SpawnedProcess:
    """What RolloutProcesses needs of a running command: pid, pipes as StreamReaders, wait()."""

    def __init__(self, popen: subprocess.Popen, stdout: asyncio.StreamReader, stderr: asyncio.StreamReader) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.stdout, self.stderr = stdout, stderr
        loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = loop.create_future()
        # A thread blocked in waitpid (no GIL held) per command, as asyncio's ThreadedChildWatcher
        # does: a pidfd watched by the loop lost its wake-up when uvloop met a reused fd number.
        threading.Thread(target=self._wait, args=(loop,), name=f"wait-{popen.pid}", daemon=True).start()

    def _wait(self, loop: asyncio.AbstractEventLoop) -> None:
        code = self.popen.wait()
        try:
            loop.call_soon_threadsafe(self._set, code)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _set(self, code: int) -> None:
        if not self._exited.done():
            self._exited.set_result(code)

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


async def _reader(pipe) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
    return reader


async def spawn(argv: list[str], *, env: dict[str, str], cwd: str, preexec: Callable[[], None]) -> SpawnedProcess:
    """Start `argv` in a new session with stdin from /dev/null and stdout/stderr piped. Raises
    OSError as Popen does. Cancelled while it starts, the command is killed, not left behind."""
    start = asyncio.ensure_future(asyncio.to_thread(
        subprocess.Popen, argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env, cwd=cwd, start_new_session=True, preexec_fn=preexec))
    try:
        popen = await asyncio.shield(start)
    except asyncio.CancelledError:
        try:
            popen = await start
        except OSError:
            raise asyncio.CancelledError from None
        kill_process_group(popen.pid)
        await asyncio.to_thread(popen.communicate)  # reap it, close its pipes
        raise
    assert popen.stdout is not None and popen.stderr is not None
    return SpawnedProcess(popen, await _reader(popen.stdout), await _reader(popen.stderr))
