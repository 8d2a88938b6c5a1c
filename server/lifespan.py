"""The app's lifespan: what starts before the first request and stops after the last.

It sweeps first what killed servers and runs left (cgroups, rollout directories and their mounts,
capture sockets). Here, not in the CLI, so every start sweeps: `serve`, OpenEnv's
`harness_env.server.app:app`, each Ray replica (Ray Serve runs this lifespan). Then the capture
proxy's Unix socket (a network-isolated sandbox's only way out), the MCP tools, the job store,
recovery of what a dead server left running, retention, the event loop's lag meter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.serve import serve_on_unix
from harness_env.core.capture.sockets import capture_socket_path
from harness_env.core.runner import Runner
from harness_env.core.sandbox.sweep import sweep_at_start
from harness_env.server.jobs.manager import JobManager
from harness_env.server.jobs.upkeep import Retention, recover, upkeep
from harness_env.server.metrics import ServerMetrics


def lifespan_of(
    proxy: CaptureProxy, runner: Runner, jobs: JobManager, mcp: Any, metrics: ServerMetrics, retention: Retention, closing: list[Callable[[], Awaitable[None]]]
):
    """The FastAPI lifespan of these parts; `closing`: what else closes at the end (the web UI)."""

    @asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        # Printed as `run` prints them: a library's root handler can swallow a logger's warning.
        for note in await asyncio.to_thread(sweep_at_start):
            print(f"harness-env: {note}", file=sys.stderr, flush=True)
        async with serve_on_unix(proxy.app, capture_socket_path()) as socket_path, mcp.lifespan():
            runner.capture = dataclasses.replace(runner.capture, socket_path=socket_path)
            await jobs.start()
            await recover(jobs)  # what a dead server left running: interrupted, its sandboxes removed
            keeper = asyncio.create_task(upkeep(jobs, retention))
            metrics.loop_lag.start()
            try:
                yield
            finally:
                await metrics.loop_lag.stop()
                keeper.cancel()
                await jobs.stop()  # running jobs are interrupted and cleaned up while the proxy still serves
                runner.capture = dataclasses.replace(runner.capture, socket_path=None)
        for close in closing:
            await close()
        await proxy.aclose()

    return lifespan
