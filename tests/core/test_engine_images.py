"""A task image's pull holds no start place (`--max-starting`): a rollout whose pull is slow lets
the others start meanwhile, and takes its place once its image is there."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import pytest

from harness_env import Endpoint, RolloutRequest, Task
from harness_env.core.engine import CaptureAccess, execute
from harness_env.core.pipeline import prepare
from harness_env.core.sandbox.factory import LocalSandboxFactory
from harness_env.rollout import loopback_proxy
from tests.core.sandbox.test_images import VERIFY, image_layout  # noqa: F401 - the tiny image

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("needs_bwrap")]
PULLING, PULL_MAY_END = threading.Event(), threading.Event()


@dataclass(frozen=True)
class SlowPull(LocalSandboxFactory):
    """The local factory whose pull waits until the test lets it end (what a real registry will
    not do on demand); the pull itself is the real one."""

    def prepare(self, limits):
        PULLING.set()
        PULL_MAY_END.wait(120)
        return super().prepare(limits)


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
            other = await asyncio.wait_for(execute(prepare(on_host, trusted=True), capture, sandbox_factory=LocalSandboxFactory(),
                                                   start_gate=gate), 120)
            assert not slow.done() and other.reward == 1.0, (other.error, other.verify_results)
            assert _phase(other, "start_wait").detail == "started at once"
        finally:
            PULL_MAY_END.set()
        result = await slow
    assert result.error is None and result.reward == 1.0, (result.error, result.verify_results)
    names = [p.name for p in result.phases]
    assert names.index("image") < names.index("start_wait") < names.index("sandbox")
