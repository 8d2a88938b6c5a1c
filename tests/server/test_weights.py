"""Weight versions across an announced sync: a real server process, the white-box harness and the
scripted fake policy."""

import time

import httpx
import pytest

from harness_env.client import HarnessEnv, HarnessEnvClientError
from tests.fakes.policy import hello_rollout

MODEL = "weights"


def _calls(policy_server) -> int:
    return sum(1 for r in policy_server.policy.tool_requests() if r.get("model") == MODEL)


def _until(condition, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_turns_record_the_version_they_were_sent_under_and_a_sync_holds_new_calls_only(module_server, policy_server):
    # The first call is in flight (2 s in the engine) when the sync begins: it is answered, with
    # the old version. The second waits until the sync ends, and is sampled by the new weights.
    script = [{"bash": "echo hello > hello.txt", "hang": 2}, {"text": "done"}]
    with HarnessEnv(module_server.url) as env:
        assert env.set_weights(1) == {"version": 1, "syncing": False, "held": 0}
        job = env.submit(hello_rollout(policy_server, MODEL, script, max_weight_lag=0))
        _until(lambda: _calls(policy_server) == 1)
        assert env.set_weights(syncing=True) == {"version": 1, "syncing": True, "held": 0}
        # The first call ends, its tool runs, the second call reaches the proxy and is held there.
        _until(lambda: httpx.get(module_server.url + "/policy/weights").json()["held"] == 1)
        assert _calls(policy_server) == 1 and env.get(job.rollout_id).status == "running"
        ended = env.set_weights(2, syncing=False)  # the held call wakes a moment after
        assert (ended["version"], ended["syncing"]) == (2, False)
        result = env.wait(job.rollout_id, timeout=60)
    assert result.reward == 1.0 and _calls(policy_server) == 2
    policy = [t for t in result.proxy_turns if t.purpose == "policy"]
    assert [(t.weight_version, t.upstream_status, t.branch) for t in policy] == [(1, 200, 0), (2, 200, 0)]
    assert [t.stale for t in policy] == [True, False]  # one version behind the end's, past max_weight_lag 0
    assert (result.graph.weight_versions, result.graph.spans_weight_versions, result.graph.stale_branches) == ([1, 2], True, [0])


def test_a_weight_update_must_say_something_valid(module_server):
    with HarnessEnv(module_server.url) as env:
        for bad in ({}, {"version": -1}, {"syncing": "maybe"}):
            r = httpx.put(module_server.url + "/policy/weights", json=bad)
            assert r.status_code == 422, bad
        with pytest.raises(HarnessEnvClientError) as refused:
            env.set_weights()
        assert refused.value.status == 422 and "version" in str(refused.value)
        assert httpx.get(module_server.url + "/policy/weights").json()["syncing"] is False


def test_a_server_that_cannot_be_told_does_not_keep_the_others_from_the_news(module_server):
    """A trainer with several servers: one unreachable must not leave the next one syncing (its
    model calls held) - every server is told, then the failure is raised."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with HarnessEnv(base_urls=[dead, module_server.url], reconnect_for_s=0) as env:
        with pytest.raises(Exception) as failed:
            env.set_weights(7, syncing=False)
    assert any(dead in note for note in getattr(failed.value, "__notes__", []))
    assert httpx.get(module_server.url + "/policy/weights").json() == {"version": 7, "syncing": False, "held": 0}
