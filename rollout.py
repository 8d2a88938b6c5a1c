"""The in-process API: run a rollout with no HTTP server.

The capture proxy is shared by every rollout of the event loop (one proxy per process, as in the
server) and listens on an ephemeral loopback port, and on a Unix socket that network-isolated
sandboxes reach, while at least one rollout runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from harness_env import envs, families  # noqa: F401 - registers the harnesses and task families
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.serve import serve_on_loopback, serve_on_unix
from harness_env.core.capture.sockets import capture_socket_path
from harness_env.core.engine import CaptureAccess
from harness_env.core.errors import InvalidRequestError
from harness_env.core.phases import EventSink
from harness_env.core.runner import Runner, prepared
from harness_env.core.sandbox import backends
from harness_env.core.sandbox.base import SandboxFactory
from harness_env.models import RolloutRequest, RolloutResult


class _LoopbackProxy:
    """Ref-counted proxy for one event loop: started by the first user, stopped by the last."""

    def __init__(self) -> None:
        self.users = 0
        self.lock = asyncio.Lock()
        self.proxy: CaptureProxy | None = None
        self.base_url = ""
        self.socket_path = ""
        self._stack: contextlib.AsyncExitStack | None = None


_by_loop: dict[int, _LoopbackProxy] = {}


@asynccontextmanager
async def loopback_proxy() -> AsyncIterator[tuple[CaptureProxy, str, str]]:
    """Yield (proxy, base_url ending in /v1, path of its Unix socket)."""
    key = id(asyncio.get_running_loop())
    state = _by_loop.setdefault(key, _LoopbackProxy())
    async with state.lock:
        if state.users == 0:
            state.proxy = CaptureProxy()
            stack = contextlib.AsyncExitStack()
            try:
                state.base_url = await stack.enter_async_context(serve_on_loopback(state.proxy.app)) + "/v1"
                state.socket_path = await stack.enter_async_context(serve_on_unix(state.proxy.app, capture_socket_path()))
            except BaseException:
                await stack.aclose()
                raise
            state._stack = stack
        state.users += 1
    try:
        assert state.proxy is not None
        yield state.proxy, state.base_url, state.socket_path
    finally:
        async with state.lock:
            state.users -= 1
            if state.users == 0:
                assert state.proxy is not None and state._stack is not None
                await state._stack.aclose()
                await state.proxy.aclose()
                state.proxy, state._stack = None, None
                _by_loop.pop(key, None)


def local_sandboxes(settings: backends.SandboxSettings | None = None) -> SandboxFactory:
    """The default backend's factory from the sandbox registry (core/sandbox/backends.py): the
    local sandbox, bubblewrap when it works here unless `settings` say otherwise
    (`SandboxSettings(use_bwrap=False)`: plain processes; what `--sandbox` gives the CLI's)."""
    return backends.sandbox_factory(backends.DEFAULT_BACKEND, settings or backends.SandboxSettings())


async def run_rollout(
    request: RolloutRequest | dict, *, on_event: EventSink | None = None, sandbox_factory: SandboxFactory | None = None, weight_version: int | None = None
) -> RolloutResult:
    """Run one rollout in this process. Always returns a result; bad input raises InvalidRequestError.
    `sandbox_factory`: another sandbox backend, or the local one made otherwise (e.g.
    `local_sandboxes(SandboxSettings(use_bwrap=False))`; default: `local_sandboxes()`). `weight_version`: the
    version of the weights the policy serves now, which every model call records (as PUT
    /policy/weights tells a server; the loop's rollouts share one proxy, so one version at a time)."""
    ready = await asyncio.to_thread(prepared, request, trusted=True)  # may read task directories
    factory = sandbox_factory or local_sandboxes()
    async with loopback_proxy() as (proxy, base_url, socket_path):
        if weight_version is not None:
            proxy.weights.update(version=weight_version)
        return await Runner(CaptureAccess(proxy, base_url, socket_path), factory).run(ready, on_event)


def run_rollout_sync(
    request: RolloutRequest | dict, *, on_event: EventSink | None = None, sandbox_factory: SandboxFactory | None = None, weight_version: int | None = None
) -> RolloutResult:
    """The synchronous twin of `run_rollout` (runs its own event loop, uvloop when installed)."""
    run = run_rollout(request, on_event=on_event, sandbox_factory=sandbox_factory, weight_version=weight_version)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(run)
    return uvloop.run(run)


async def run_many(
    requests: list[RolloutRequest | dict], *, concurrency: int = 8, sandbox_factory: SandboxFactory | None = None, weight_version: int | None = None
) -> list[RolloutResult]:
    """Run rollouts in this process, `concurrency` at a time; results in request order. Bad input
    becomes a result with `error_kind: "invalid_request"` (a batch never raises midway).
    `sandbox_factory`, `weight_version`: as for run_rollout, the whole batch's."""
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(request: RolloutRequest | dict) -> RolloutResult:
        async with sem:
            try:
                return await run_rollout(request, sandbox_factory=sandbox_factory, weight_version=weight_version)
            except InvalidRequestError as e:
                return RolloutResult(error=str(e), error_kind="invalid_request")

    return list(await asyncio.gather(*(one(r) for r in requests)))


def run_many_sync(
    requests: list[RolloutRequest | dict], *, concurrency: int = 8, sandbox_factory: SandboxFactory | None = None, weight_version: int | None = None
) -> list[RolloutResult]:
    """The synchronous twin of `run_many` (e.g. the RunMany of client.trl's adapters)."""
    return asyncio.run(run_many(requests, concurrency=concurrency, sandbox_factory=sandbox_factory, weight_version=weight_version))
