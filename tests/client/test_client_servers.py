"""A client over several servers (replicas with no load balancer in front): rollouts spread by
least outstanding work, a busy or unreachable server passes the work on, the busy error only when
every server refused; a job's calls go to the server that owns it; listings merge servers."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from harness_env.client import AsyncHarnessEnv, HarnessEnv, HarnessEnvClientError
from harness_env.client.listing import merge_pages
from harness_env.client.servers import Servers
from harness_env.client.trl import remote_runner
from harness_env.models import JobEnd
from tests.fakes.policy import HELLO, hello_rollout
from tests.server_process import ServerProcess, free_port

pytestmark = pytest.mark.slow  # servers in processes of their own: not in the fast tier

FULL_AT_ONE = ("--max-concurrent", "1", "--max-queue", "0")
SLOW = [{"bash": "sleep 4; echo hello > hello.txt"}, {"text": "done"}]


def nobody_listening() -> str:
    return f"http://127.0.0.1:{free_port()}"


def holds(url: str, rollout_id: str) -> bool:
    """Whether that server's own store has the rollout (asked directly, not through the client)."""
    status = httpx.get(f"{url}/rollouts/{rollout_id}").status_code
    assert status in (200, 404)
    return status == 200


def wait_running(server: ServerProcess, n: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while httpx.get(server.url + "/health").json()["rollouts_running"] != n:
        assert time.monotonic() < deadline, f"{server.url} never had {n} rollouts running"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two servers that each run one rollout at a time and queue none."""
    servers: list[ServerProcess] = []
    try:
        for _ in range(2):
            servers.append(ServerProcess(tmp_path_factory.mktemp("pair-sandboxes"), *FULL_AT_ONE))
        yield servers
    finally:
        for s in servers:
            s.stop()


# -- bad addresses ------------------------------------------------------------------------------
@pytest.mark.parametrize("client", [HarnessEnv, AsyncHarnessEnv])
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_url": "http://a:1", "base_urls": ["http://b:1"]}, "either base_url (one server) or base_urls (several), not both"),
        ({}, "give the server's address: HarnessEnv(url), or HarnessEnv(base_urls=[url, ...])"),
        ({"base_urls": []}, "base_urls is empty"),
        ({"base_urls": "http://a:1"}, "base_urls is a list of addresses; for one server pass it as HarnessEnv(url)"),
        ({"base_urls": ["http://a:1", "ftp://b"]}, "base_urls[1] is not an http(s) address: 'ftp://b'"),
        ({"base_urls": ["http://a:1", "http://a:1/"]}, "base_urls[1] is listed twice: 'http://a:1'"),
        ({"base_urls": ["http://a:1", None]}, "base_urls[1] is a NoneType, not an address"),
        ({"base_url": "a:1"}, "base_url is not an http(s) address: 'a:1'"),
    ],
)
def test_bad_addresses_get_one_clear_error(client, kwargs, message):
    with pytest.raises(ValueError) as bad:
        client(**kwargs)
    assert message in str(bad.value)


def test_a_secret_in_a_bad_address_is_not_repeated_in_the_error():
    with pytest.raises(ValueError) as bad:
        HarnessEnv(base_urls=["http://a:1", "ftp://me:s3cret@b/x?token=t0ken"])
    assert str(bad.value) == "base_urls[1] is not an http(s) address: 'ftp://b/x' (give one like 'http://host:8100')"
    with pytest.raises(ValueError) as bad:
        HarnessEnv(base_urls=["http://me:s3cret@[::1"])
    assert "s3cret" not in str(bad.value) and "base_urls[0] is not an http(s) address" in str(bad.value)


def test_one_url_is_as_before_and_a_merged_listing_checks_its_arguments_first():
    with HarnessEnv("http://127.0.0.1:9/") as env:
        assert env.base_url == "http://127.0.0.1:9" and env.base_urls == ["http://127.0.0.1:9"]
    with HarnessEnv(base_urls=["http://127.0.0.1:9", "http://127.0.0.1:10"]) as env:
        # A listing cursor of one server is not one of a merged listing: said before any call.
        with pytest.raises(ValueError, match="not a next_cursor of this client's listing"):
            env.list_rollouts(before="123")
        with pytest.raises(ValueError, match="limit must be a whole number from 1 to 500"):
            env.list_rollouts(limit=0)


# -- choosing a server (the client's own bookkeeping) ---------------------------------------------
def test_the_server_with_the_fewest_in_flight_is_chosen_ties_in_turn_and_a_refusing_one_rests():
    a, b, c = "http://a", "http://b", "http://c"
    servers = Servers([a, b, c])
    assert [servers.take(()) for _ in range(4)] == [a, b, c, a]  # ties: in turn
    servers.release(b)
    assert servers.take(()) == b  # the fewest in flight, though c is next in turn
    servers.release(a)
    servers.release(a)  # a: 0, b: 1, c: 1
    servers.refused(a)  # it refused: it rests, after every other, however little it has
    assert servers.take(()) == c  # b and c tie: c is next in turn
    assert servers.take({b, c}) == a  # tried last, not never
    assert servers.take({a, b, c}) is None
    servers.release(a)
    servers.reached(a)  # it answered again: no longer resting
    assert servers.take(()) == a

    # A submitted job stays counted until it is seen ended; named again (an idempotent repeat that
    # another replica on the same store answered), it is still counted once.
    jobs = Servers([a, b])
    assert jobs.take(()) == a
    jobs.own("job1", a, counted=True)
    assert jobs.take(()) == b  # a has job1 in flight
    jobs.own("job1", b, counted=True)
    assert jobs.take(()) == b  # a: 1, b: 0
    jobs.release(b)
    jobs.ended("job1")
    assert jobs.take(()) == a  # both 0 again: a is next in turn


def test_replicas_sharing_one_store_list_each_rollout_once():
    # Both servers answer the same rollouts (one store): the merged page shows each once, and
    # counts both copies as shown, so the next page starts after them on each server.
    same = [{"rollout_id": rid, "created_at": t} for rid, t in (("r3", 3.0), ("r2", 2.0), ("r1", 1.0))]
    used, items = merge_pages({0: same, 1: list(same)}, limit=2)
    assert [i["rollout_id"] for i in items] == ["r3", "r2"] and used == {0: 2, 1: 2}
    used, items = merge_pages({0: same[2:], 1: same[2:]}, limit=2)
    assert [i["rollout_id"] for i in items] == ["r1"] and used == {0: 1, 1: 1}


# -- real servers -----------------------------------------------------------------------------------
def test_two_at_once_run_one_on_each_server_and_a_third_gets_the_busy_error(pair, policy_server):
    a, b = pair
    with HarnessEnv(base_urls=[a.url, b.url]) as env:
        results: dict[str, object] = {}
        threads = [
            threading.Thread(target=lambda m=m: results.update({m: env.run_rollout(hello_rollout(policy_server, m, SLOW))})) for m in ("spread-1", "spread-2")
        ]
        for t in threads:
            t.start()
        try:
            wait_running(a, 1)
            wait_running(b, 1)
            with pytest.raises(HarnessEnvClientError) as refused:  # both full: the refusal, as from one server
                env.run_rollout(hello_rollout(policy_server, "spread-3"))
            assert refused.value.status == 429 and refused.value.message.startswith("server busy: 1 running, 0 queued")
            # The trainer's path: the refusal becomes a result with its error, never a crashed step.
            request = {
                "harness": "whitebox",
                "endpoint": {"base_url": policy_server.base_url, "model": "spread-3"},
                "task": {"instruction": "x", "verify": ["true"]},
            }
            (unscored,) = remote_runner(env)([request])
            assert unscored.reward is None and "429: server busy" in unscored.error
        finally:
            for t in threads:
                t.join(60)
        first, second = results["spread-1"], results["spread-2"]
        assert first.reward == second.reward == 1.0 and first.error is None and second.error is None
        # The result says which server ran it, and that server's own store holds it (the other's does not).
        assert {env.server_of(first.rollout_id), env.server_of(second.rollout_id)} == {a.url, b.url}
        for result in (first, second):
            owner = env.server_of(result.rollout_id)
            other = b.url if owner == a.url else a.url
            assert holds(owner, result.rollout_id) and not holds(other, result.rollout_id)
    assert not any(r.get("model") == "spread-3" for r in policy_server.policy.tool_requests())  # refused everywhere: never ran
    a.assert_no_rollout_left()
    b.assert_no_rollout_left()


def test_a_server_busy_with_other_work_passes_the_rollout_to_the_next(pair, policy_server):
    a, b = pair
    with HarnessEnv(a.url) as other_trainer:  # fills a with work this client does not know of
        occupying = other_trainer.submit(hello_rollout(policy_server, "busy-elsewhere", SLOW))
        with HarnessEnv(base_urls=[a.url, b.url]) as env:
            called = env.run_rollout(hello_rollout(policy_server, "passed-on-call"))  # a is asked first, refuses
            assert called.reward == 1.0 and env.server_of(called.rollout_id) == b.url and holds(b.url, called.rollout_id)
            submitted = env.submit(hello_rollout(policy_server, "passed-on-job"))
            assert env.server_of(submitted.rollout_id) == b.url
            assert env.wait(submitted.rollout_id, timeout=60).reward == 1.0
        assert other_trainer.wait(occupying.rollout_id, timeout=60).reward == 1.0
    a.assert_no_rollout_left()
    b.assert_no_rollout_left()


async def test_with_one_server_down_rollouts_go_to_the_other(pair, policy_server):
    live = pair[0]
    down = nobody_listening()
    async with AsyncHarnessEnv(base_urls=[down, live.url]) as env:
        results = [await env.run_rollout(hello_rollout(policy_server, f"down-{i}")) for i in range(2)]
        assert [r.reward for r in results] == [1.0, 1.0]
        assert {env.server_of(r.rollout_id) for r in results} == {live.url}
        accepted = await env.submit(hello_rollout(policy_server, "down-job"))
        assert env.server_of(accepted.rollout_id) == live.url
        assert (await env.wait(accepted.rollout_id, timeout=60)).reward == 1.0
        assert (await env.health())["status"] == "healthy"  # answered by the server that is up
    # The TRL adapter takes the same client: its rollouts reach the live server too.
    policy_server.policy.scripts["down-trl"] = HELLO
    request = {
        "harness": "whitebox",
        "endpoint": {"base_url": policy_server.base_url, "model": "down-trl"},
        "task": {"instruction": "Create hello.txt containing hello.", "verify": ["grep -qx hello hello.txt"]},
    }
    with HarnessEnv(base_urls=[down, live.url]) as sync_env:
        assert [r.reward for r in remote_runner(sync_env, concurrency=1)([request, request])] == [1.0, 1.0]
    live.assert_no_rollout_left()


async def test_jobs_are_looked_up_and_cancelled_on_the_server_that_owns_them_and_listings_merge(pair, policy_server):
    a, b = pair
    async with AsyncHarnessEnv(base_urls=[a.url, b.url]) as env:
        slow = await env.submit(hello_rollout(policy_server, "owned-slow", SLOW))
        quick = await env.submit(hello_rollout(policy_server, "owned-quick"))  # a has one in flight: this goes to b
        assert (env.server_of(slow.rollout_id), env.server_of(quick.rollout_id)) == (a.url, b.url)
        assert holds(a.url, slow.rollout_id) and not holds(b.url, slow.rollout_id)
        assert (await env.wait(quick.rollout_id, timeout=60)).reward == 1.0
        cancelled = await env.cancel(slow.rollout_id)  # reaches a, which runs it
        assert cancelled.rollout_id == slow.rollout_id
        end = [e async for e in env.events(slow.rollout_id)][-1]
        assert isinstance(end, JobEnd) and (end.rollout_id, end.status) == (slow.rollout_id, "cancelled")
        assert httpx.get(f"{a.url}/rollouts/{slow.rollout_id}").json()["status"] == "cancelled"
        # Every rollout of both servers, newest first, each once; page by page the same, no more.
        listed = await env.list_rollouts(limit=500)
        ids = [i["rollout_id"] for i in listed["items"]]
        assert {slow.rollout_id, quick.rollout_id} <= set(ids) and listed["next_cursor"] is None
        direct = [i for s in (a, b) for i in httpx.get(f"{s.url}/rollouts", params={"limit": 500}).json()["items"]]
        assert sorted(ids) == sorted(i["rollout_id"] for i in direct)
        assert ids == [i["rollout_id"] for i in sorted(direct, key=lambda i: -i["created_at"])]
        paged, cursor = [], None
        while True:
            page = await env.list_rollouts(limit=2, before=cursor)
            assert len(page["items"]) <= 2
            paged += [i["rollout_id"] for i in page["items"]]
            if (cursor := page["next_cursor"]) is None:
                break
        assert paged == ids
    # A client that did not submit them (another process, a restart) finds each on its own server.
    async with AsyncHarnessEnv(base_urls=[b.url, a.url]) as fresh:
        assert (await fresh.get(slow.rollout_id)).status == "cancelled"
        assert fresh.server_of(slow.rollout_id) == a.url
        assert (await fresh.wait(quick.rollout_id, timeout=10)).reward == 1.0
        with pytest.raises(HarnessEnvClientError) as missing:
            await fresh.get("0123456789ab")
        assert missing.value.status == 404
    a.assert_no_rollout_left()
    b.assert_no_rollout_left()
