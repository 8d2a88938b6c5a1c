"""Starting a sandbox command without holding the event loop.

asyncio's create_subprocess_exec starts the child on the event loop and waits there until it has
exec'd. Here the start happens in a worker thread, without a preexec function (the rollout's
cgroup and rlimits are set by the command's entry shell, core/sandbox/limits.py) so that Popen
vforks: a fork with a preexec function holds the GIL while it copies the page tables of a server
of a few hundred MB, about 30 ms per command during which no other rollout's I/O moves. The pipes
are then read by the loop, and a thread per command waits for its exit.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor

from harness_env.core.procs import kill_process_group

# Commands start here, not in the loop's default executor: there the starts of hundreds of running
# rollouts' tool calls queued ahead of new rollouts' sandbox creation.
SPAWNERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="command-start")
# Each running command holds one (idle ones are reused); as many as commands can run at once.
WAITERS = ThreadPoolExecutor(max_workers=4096, thread_name_prefix="command-wait")


class SpawnedProcess:
    """What RolloutProcesses needs of a running command: pid, pipes as StreamReaders, wait()."""

    def __init__(self, popen: subprocess.Popen, exited: Future[int], stdout: asyncio.StreamReader, stderr: asyncio.StreamReader) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.stdout, self.stderr = stdout, stderr
        self._exited = asyncio.wrap_future(exited)

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() and not self._exited.cancelled() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


class _PipeEnd:
    """The read end of a command's pipe, as the loop's pipe transport holds it. uvloop (libuv)
    closes the descriptor itself and then calls close() on this object as well: on a file object
    that is a second close of a number another thread (starting a command) may have been given
    meanwhile, closing that thread's pipe. So close() closes the descriptor only on loops that
    close through it (asyncio's own)."""

    def __init__(self, fd: int, loop_closes: bool) -> None:
        self._fd, self._loop_closes, self._closed = fd, loop_closes, False

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if not self._loop_closes:
                os.close(self._fd)


async def _reader(popen: subprocess.Popen, name: str) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    pipe = getattr(popen, name)
    fd = os.dup(pipe.fileno())  # ours alone: Popen's file object is closed at once, and forgotten
    pipe.close()
    setattr(popen, name, None)
    reader = asyncio.StreamReader(loop=loop)
    end = _PipeEnd(fd, loop_closes=type(loop).__module__.startswith("uvloop"))
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), end)
    except BaseException:
        end.close()
        raise
    return reader


def _start(argv: list[str], env: dict[str, str], cwd: str) -> tuple[subprocess.Popen, Future[int]]:
    """In a SPAWNERS thread: start the command, and a WAITERS thread blocked in waitpid (no GIL
    held) until it exits, as asyncio's ThreadedChildWatcher does but pooled. Handed to the pool
    here, not on the loop: a pool that grows starts a thread and waits for it to run. (A pidfd
    watched by the loop lost its wake-up when uvloop met a reused fd number.)"""
    popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True)
    return popen, WAITERS.submit(popen.wait)


async def spawn(argv: list[str], *, env: dict[str, str], cwd: str) -> SpawnedProcess:
    """Start `argv` in a new session with stdin from /dev/null and stdout/stderr piped. Raises
    OSError as Popen does. Cancelled while it starts, the command is killed, not left behind."""
    start = asyncio.ensure_future(asyncio.get_running_loop().run_in_executor(SPAWNERS, _start, argv, env, cwd))
    try:
        popen, exited = await asyncio.shield(start)
    except asyncio.CancelledError:
        try:
            popen, exited = await start
        except OSError:
            raise asyncio.CancelledError from None
        kill_process_group(popen.pid)
        await asyncio.to_thread(popen.communicate)  # its pipes read and closed (its waiter reaps it)
        raise
    try:
        out, err = await _reader(popen, "stdout"), await _reader(popen, "stderr")
    except BaseException:
        kill_process_group(popen.pid)  # reaped by its waiter, not left a zombie
        raise
    return SpawnedProcess(popen, exited, out, err)
