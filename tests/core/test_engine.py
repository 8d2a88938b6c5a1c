"""The engine's lifecycle as a user sees it, against the scripted policy."""

import os

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout

pytestmark = pytest.mark.e2e


async def test_an_endpoint_without_the_chat_route_ends_the_rollout_before_the_agent(policy_server):
    req = RolloutRequest(
        task=Task(instruction="x", verify=["true"]), endpoint=Endpoint(base_url=policy_server.base_url + "/nope", model="m"), harness="whitebox"
    )
    res = await run_rollout(req)
    assert res.error_kind == "endpoint" and "404" in res.error and res.reward is None
    assert [p.name for p in res.phases] == ["endpoint", "collect"]  # no sandbox, no agent


# Issue 25, critical 2: ends the agent can bring about are graded, never left out as "infrastructure".
DONE_SCRIPT = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]


def _whitebox_request(policy_server, script, verify=("test -f hello.txt", "false")):
    policy_server.policy.scripts["m"] = script
    return RolloutRequest(
        task=Task(instruction="make hello.txt", verify=list(verify)),
        harness="whitebox",
        endpoint=Endpoint(base_url=policy_server.base_url, model="m"),
        agent_timeout_s=30,
    )


async def test_verify_that_cannot_run_on_what_the_agent_left_scores_0(policy_server):
    from harness_env.core.errors import SandboxError
    from tests.fakes.sandbox import DirSandbox, DirSandboxFactory

    class FullDisk(DirSandbox):
        def clear_reward_file(self) -> None:
            raise SandboxError("could not reset the verifier directory: No space left on device")

    class Factory(DirSandboxFactory):
        def __call__(self, **kw):
            box = super().__call__(**kw)
            box.__class__ = FullDisk
            return box

    res = await run_rollout(_whitebox_request(policy_server, DONE_SCRIPT), sandbox_factory=Factory())
    assert (res.error_kind, res.reward, res.reward_source) == ("verify", 0.0, "verify_failed"), (res.error_kind, res.error)
    assert "No space left" in res.error


async def test_a_harness_whose_run_cannot_be_read_back_is_graded_once_the_policy_acted(policy_server, monkeypatch):
    from harness_env.envs.whitebox.harness import WhiteboxHarness

    real = WhiteboxHarness.run_agent

    async def unreadable(self, ctx, sandbox, stop):
        await real(self, ctx, sandbox, stop)
        raise ValueError("session log is not JSON")  # what a planted log would do to a reader

    monkeypatch.setattr(WhiteboxHarness, "run_agent", unreadable)
    res = await run_rollout(_whitebox_request(policy_server, DONE_SCRIPT))
    assert (res.error_kind, res.reward, res.reward_source) == ("agent_error", 0.5, "verify_ratio"), (res.error_kind, res.error)
    assert "could not be read back" in res.error


async def test_a_failure_before_the_policy_acted_is_not_graded(policy_server):
    """The endpoint rejects the harness's first request (nothing of the policy's exists yet)."""
    res = await run_rollout(_whitebox_request(policy_server, [{"status": 400}] * 4))
    assert res.error_kind == "agent_error" and res.reward is None and res.verify_results == []


async def test_the_endpoint_rejecting_a_later_call_is_graded(policy_server):
    res = await run_rollout(_whitebox_request(policy_server, [{"bash": "echo hello > hello.txt"}, *[{"status": 400}] * 4]))
    assert (res.error_kind, res.reward) == ("agent_error", 0.5), (res.error_kind, res.error, res.reward)


async def test_a_5xx_the_agents_calls_get_from_an_endpoint_that_answers_the_proxy_is_graded(policy_server):
    """The agent's calls carried something the endpoint answers with 500 (a grammar that crashes
    it, say) while the endpoint answers the proxy's own call: not an endpoint failure."""
    res = await run_rollout(_whitebox_request(policy_server, [{"bash": "echo hello > hello.txt"}, *[{"status": 500}] * 6]))
    assert (res.error_kind, res.reward) == ("agent_error", 0.5), (res.error_kind, res.error)
    assert "answers the proxy's own call" in res.error


async def test_an_endpoint_that_fails_the_proxys_own_call_too_is_an_endpoint_failure(policy_server):
    res = await run_rollout(_whitebox_request(policy_server, [{"bash": "echo hello > hello.txt"}, {"status": 500, "down": True}]))
    assert (res.error_kind, res.reward) == ("endpoint", None), (res.error_kind, res.error)
    assert any(t.purpose == "policy" and t.upstream_status == 200 for t in res.proxy_turns)  # the policy had acted


async def test_a_sandbox_still_being_made_when_the_rollout_is_cancelled_is_closed_once_made(policy_server, tmp_path, monkeypatch):
    """Making a sandbox runs in a thread that a cancel cannot stop (a task image's pull takes
    minutes): the sandbox it makes after the cancel is closed, not left to a restart's sweep."""
    import asyncio
    import threading

    from tests.fakes.sandbox import DirSandboxFactory

    entered, release, closed = threading.Event(), threading.Event(), asyncio.Event()

    class SlowFactory(DirSandboxFactory):
        def __call__(self, **kw):
            entered.set()
            release.wait(30)  # the pull
            box = super().__call__(**kw)
            real_close = box.close

            async def close():
                problem = await real_close()
                closed.set()
                return problem

            box.close = close
            return box

    monkeypatch.setenv("HARNESS_ENV_SANDBOX_DIR", str(tmp_path))
    factory = SlowFactory()
    rollout = asyncio.ensure_future(run_rollout(_whitebox_request(policy_server, DONE_SCRIPT), sandbox_factory=factory))
    assert await asyncio.to_thread(entered.wait, 30)
    rollout.cancel()
    with pytest.raises(asyncio.CancelledError):
        await rollout
    release.set()
    await asyncio.wait_for(closed.wait(), 30)
    assert list(tmp_path.iterdir()) == []  # its directory removed


async def test_rollouts_making_slow_sandboxes_never_hold_up_the_servers_other_blocking_work(policy_server, tmp_path, monkeypatch):
    """More rollouts than the event loop's default pool has threads, each making a sandbox that
    takes long (a task image's pull): the server's other blocking calls still run meanwhile."""
    import asyncio
    import threading

    from tests.fakes.sandbox import DirSandboxFactory

    release, entered = threading.Event(), threading.Semaphore(0)

    class SlowFactory(DirSandboxFactory):
        def __call__(self, **kw):
            entered.release()
            release.wait(120)
            return super().__call__(**kw)

    monkeypatch.setenv("HARNESS_ENV_SANDBOX_DIR", str(tmp_path))
    n = min(32, (os.cpu_count() or 1) + 4) + 2  # the default pool's size, and more
    rollouts = [asyncio.ensure_future(run_rollout(_whitebox_request(policy_server, DONE_SCRIPT), sandbox_factory=SlowFactory())) for _ in range(n)]
    try:
        for _ in range(n):
            # every one of them is making its sandbox (on the loop's own pool, the later ones would wait for a thread)
            assert await asyncio.wait_for(asyncio.to_thread(entered.acquire, True, 30), 40)
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "answered"), 10) == "answered"
    finally:
        release.set()
        results = await asyncio.gather(*rollouts)
    assert [r.reward for r in results] == [0.5] * n, [r.error for r in results]
