"""Starting a sandbox command without holding the event loop.

asyncio's create_subprocess_exec forks on the event loop and then waits there until the child has
run its preexec function (rlimits, joining the rollout's cgroup) and exec'd: tens of milliseconds
per command in a server of a few hundred MB, during which no other rollout's I/O moves. With
hundreds of rollouts each running a command per tool call, that was most of the loop's lag. Here
the fork and exec happen in a worker thread; the pipes and the exit are then watched by the loop
(the exit through a pidfd: no thread waits on it).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
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
        self._pidfd = os.pidfd_open(popen.pid)
        loop.add_reader(self._pidfd, self._on_exit)

    def _on_exit(self) -> None:
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        code = self.popen.wait()  # it has exited: this only reaps it
        if not self._exited.done():
            self._exited.set_result(code)

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

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
