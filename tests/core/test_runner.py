"""core/runner.py: the one path from a request to the engine. The queue of running places is a
phase of that path (an event, a Phase record) and a rollout cancelled while it waits says it
never started; the request is resolved once, however a face names its sandbox backend."""

import asyncio

import pytest

from harness_env.core.engine import CaptureAccess
from harness_env.core.errors import InvalidRequestError
from harness_env.core.runner import NOT_STARTED, Runner, prepared, resolve
from harness_env.core.sandbox import backends
from harness_env.models import PhaseEvent, RolloutArgs
from harness_env.rollout import loopback_proxy
from harness_env.server.slots import RolloutSlots
from tests.fakes.policy import hello_rollout
from tests.fakes.sandbox import DirSandboxFactory

pytestmark = pytest.mark.e2e


async def test_the_queue_is_the_first_phase_and_its_events_come_first(policy_server):
    ready = resolve(RolloutArgs(**hello_rollout(policy_server, "queued")), trusted=False)
    slots, factory = RolloutSlots(1, 4), DirSandboxFactory()
    async with loopback_proxy() as (proxy, base_url, socket_path):
        runner = Runner(CaptureAccess(proxy, base_url, socket_path), factory, start_gate=slots.starting, places=slots)
        events: list[PhaseEvent] = []
        first, second = runner.rollout(ready), runner.rollout(ready, events.append)
        results = await asyncio.gather(first.execute(), second.execute())
    for result in results:
        assert result.error is None and result.reward == 1.0, result.error
        assert [p.name for p in result.phases][:3] == ["queue", "endpoint", "start_wait"]
        assert result.phases[0].detail == "waited for one of 1 running places"
    assert [(e.phase, e.status) for e in events[:3]] == [("queue", "started"), ("queue", "finished"), ("endpoint", "started")]
    assert {e.rollout_id for e in events} == {second.rollout_id} and len(factory.made) == 2


async def test_a_rollout_cancelled_in_the_queue_says_it_never_started(policy_server):
    ready = resolve(RolloutArgs(**hello_rollout(policy_server, "never")), trusted=False)
    slots, factory = RolloutSlots(1, 4), DirSandboxFactory()
    async with loopback_proxy() as (proxy, base_url, socket_path):
        runner = Runner(CaptureAccess(proxy, base_url, socket_path), factory, places=slots)
        events: list[PhaseEvent] = []
        rollout = runner.rollout(ready, events.append, rollout_id="0123456789ab")
        async with slots.slot():  # the one running place is taken
            task = asyncio.ensure_future(rollout.execute())
            while not events:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    result = rollout.result
    assert (result.rollout_id, result.error, result.error_kind, result.reward) == ("0123456789ab", NOT_STARTED, "cancelled", None)
    assert [(p.name, p.ok) for p in result.phases] == [("queue", False)] and factory.made == []
    assert slots.running == 0 and slots.queued == 0


def test_a_remote_caller_is_held_to_the_server_maximums_before_any_work(policy_server, monkeypatch):
    monkeypatch.setenv("HARNESS_ENV_MAX_MEMORY_LIMIT_MB", "1024")
    args = RolloutArgs(**hello_rollout(policy_server, "big"), memory_limit_mb=2048)
    with pytest.raises(InvalidRequestError, match="memory_limit_mb=2048 is over this server's maximum"):
        resolve(args, trusted=False)
    # In process, the engine refuses it as a result (tests/core/test_engine_attacks.py), not here.
    assert prepared(resolve(args, trusted=True).request, trusted=True).request.memory_limit_mb == 2048


def test_an_unknown_backend_name_is_one_clear_error():
    with pytest.raises(InvalidRequestError) as e:
        backends.sandbox_factory("nowhere", backends.SandboxSettings())
    assert str(e.value) == "unknown sandbox backend 'nowhere'; choose one of: " + ", ".join(sorted(backends.SANDBOX_BACKENDS))
