"""A task image's pull holds no start place (`--max-starting`): a rollout whose pull is slow lets
the others start meanwhile, and takes its place once its image is there."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import pytest

from harness_env import Endpoint, RolloutRequest, Task
from harness_env.core.engine import CaptureAccess, execute
from harness_env.core.pipeline import prepare
from harness_env.core.sandbox.factory import LocalSandboxFactory
from harness_env.rollout import loopback_proxy
from tests.core.sandbox.test_images import VERIFY, image_layout  # noqa: F401 - the tiny image

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("needs_bwrap")]
PULLING, PULL_MAY_END, PULLED = threading.Event(), threading.Event(), threading.Event()


@dataclass(frozen=True)
class SlowPull(LocalSandboxFactory):
    """The local factory whose pull waits until the test lets it end (what a real registry will
    not do on demand); the pull itself is the real one."""

    def prepare(self, limits):
        PULLING.set()
        PULL_MAY_END.wait(120)
        try:
            return super().prepare(limits)
        finally:
            PULLED.set()


class OnePlace:
    """A start gate of one place (as `--max-starting 1`)."""

    def __init__(self) -> None:
        self.free = asyncio.Semaphore(1)

    async def acquire(self) -> int:
        await self.free.acquire()
        return 0

    def release(self) -> None:
        self.free.release()


def _phase(result, name: str):
    return next(p for p in result.phases if p.name == name)


async def test_a_slow_pull_leaves_the_start_place_to_the_others(policy_server, image_layout):  # noqa: F811
    policy_server.policy.scripts["m"] = [{"bash": "only-in-image > made.txt || echo host > made.txt"}, {"text": "done"}]
    endpoint = Endpoint(base_url=policy_server.base_url, model="m")
    in_image = RolloutRequest(task=Task(instruction="x", verify=VERIFY, image=image_layout), harness="whitebox", endpoint=endpoint)
    on_host = RolloutRequest(task=Task(instruction="x", verify=["grep -qx host made.txt"]), harness="whitebox", endpoint=endpoint)
    gate = OnePlace()
    PULLING.clear(), PULL_MAY_END.clear()
    async with loopback_proxy() as (proxy, base_url, socket):
        capture = CaptureAccess(proxy, base_url, socket)
        slow = asyncio.ensure_future(execute(prepare(in_image, trusted=True), capture, sandbox_factory=SlowPull(), start_gate=gate))
        try:
            assert await asyncio.to_thread(PULLING.wait, 60)
            # One place, and the image rollout is pulling: this one still starts (never waits for the pull).
            other = await asyncio.wait_for(execute(prepare(on_host, trusted=True), capture, sandbox_factory=LocalSandboxFactory(), start_gate=gate), 120)
            assert not slow.done() and other.reward == 1.0, (other.error, other.verify_results)
            assert _phase(other, "start_wait").detail == "started at once"
        finally:
            PULL_MAY_END.set()
        result = await slow
    assert result.error is None and result.reward == 1.0, (result.error, result.verify_results)
    names = [p.name for p in result.phases]
    assert names.index("image") < names.index("start_wait") < names.index("sandbox")


@dataclass(frozen=True)
class Counting(SlowPull):
    """SlowPull that counts what it is given back."""

    released: list = field(default_factory=list, compare=False)

    def release(self, limits):
        self.released.append(limits.task_image.digest)
        super().release(limits)


async def _held_counts_settle(images, want: dict) -> dict:
    for _ in range(200):  # the late release runs on the loop once the pull's thread is done
        if dict(images._held) == want:
            break
        await asyncio.sleep(0.05)
    return dict(images._held)


async def test_a_rollout_cancelled_after_or_during_its_pull_lets_go_of_its_image(policy_server, image_layout):  # noqa: F811
    """An image is held from eviction from its pull until a sandbox mounts it. A rollout cancelled
    while it waits for a start place (after its pull), or while its pull still runs, lets go of it:
    else it would stay unevictable until the server restarts."""
    from harness_env.core.sandbox import images

    endpoint = Endpoint(base_url=policy_server.base_url, model="m")
    req = RolloutRequest(task=Task(instruction="x", verify=VERIFY, image=image_layout), harness="whitebox", endpoint=endpoint)
    gate = OnePlace()
    await gate.acquire()  # the only start place is taken: the rollout waits after its pull
    async with loopback_proxy() as (proxy, base_url, socket):
        capture = CaptureAccess(proxy, base_url, socket)
        at_gate = asyncio.Event()
        waiting = asyncio.ensure_future(
            execute(
                prepare(req, trusted=True),
                capture,
                sandbox_factory=LocalSandboxFactory(),
                start_gate=gate,
                on_event=lambda e: e.phase == "start_wait" and at_gate.set(),
            )
        )
        await asyncio.wait_for(at_gate.wait(), 120)
        assert list(images._held.values()) == [1]  # pulled, held, not mounted: waiting for the place
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert dict(images._held) == {}
        PULLING.clear(), PULL_MAY_END.clear(), PULLED.clear()
        released = []
        factory = Counting(released=released)
        pulling = asyncio.ensure_future(execute(prepare(req, trusted=True), capture, sandbox_factory=factory, start_gate=gate))
        assert await asyncio.to_thread(PULLING.wait, 60)
        pulling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pulling
        PULL_MAY_END.set()  # the pull ends after its rollout did: it holds the image then
        assert await asyncio.to_thread(PULLED.wait, 60)
        assert await _held_counts_settle(images, {}) == {} and len(released) == 1
    gate.release()
