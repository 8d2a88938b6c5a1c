"""The client's jobs against a real server: submit, get, wait, events (sync and async); a client
whose connection is cut mid-wait (or mid-events) still gets everything, and the rollout ran once;
a busy server is waited out by run_many, never losing a rollout nor running one twice."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from harness_env.client import AsyncHarnessEnv, HarnessEnv, HarnessEnvClientError
from harness_env.models import JobEnd, PhaseEvent
from tests.fakes.policy import hello_rollout

pytestmark = pytest.mark.e2e


def runs_of(srv, model: str) -> int:
    """How many times a rollout of `model` started: its agent's first model call."""
    return sum(1 for r in srv.policy.tool_requests() if r.get("model") == model and not any(m.get("role") == "assistant" for m in r["messages"]))


class CuttableProxy:
    """A TCP forwarder between the client and the server whose connections can be cut, and which
    can refuse for a while (every new connection closed at once), as a flaky network does."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.down_until = 0.0
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if time.monotonic() < self.down_until:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self, down_for_s: float) -> int:
        """Cut every open connection; refuse new ones for `down_for_s`. Returns how many were cut."""
        self.down_until = time.monotonic() + down_for_s
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        return len(conns) // 2

    def close(self) -> None:
        self.listener.close()
        self.cut(0)


@pytest.fixture
def server(module_server):
    """One server for the module's tests, which tell their rollouts apart by model name."""
    return module_server


def test_a_client_cut_off_mid_wait_still_gets_its_result_and_the_rollout_ran_once(server, policy_server) -> None:
    proxy = CuttableProxy(server.port)
    try:
        with HarnessEnv(proxy.url, reconnect_for_s=60) as env:
            accepted = env.submit(hello_rollout(policy_server, "cut-wait", [{"bash": "sleep 4; echo hello > hello.txt"}, {"text": "done"}]))
            waiter: dict = {}
            thread = threading.Thread(target=lambda: waiter.update(result=env.wait(accepted.rollout_id)))
            thread.start()
            time.sleep(1.5)  # the long poll is open
            assert proxy.cut(down_for_s=2) >= 1
            thread.join(60)
            result = waiter["result"]
            assert result.reward == 1.0 and result.rollout_id == accepted.rollout_id
        assert runs_of(policy_server, "cut-wait") == 1
        assert [i["model"] for i in httpx.get(server.url + "/rollouts").json()["items"]].count("cut-wait") == 1
    finally:
        proxy.close()


def test_a_submission_repeated_after_a_drop_runs_once(server, policy_server) -> None:
    with HarnessEnv(server.url) as env:
        body = hello_rollout(policy_server, "resubmit")
        first = env.submit(body, idempotency_key="trainer-step-7-sample-3")
        second = env.submit(body, idempotency_key="trainer-step-7-sample-3")  # as a retry after a lost answer sends it
        assert second.rollout_id == first.rollout_id and not second.created
        assert env.wait(first.rollout_id).reward == 1.0
        job = env.get(first.rollout_id, wait_s=1)
        assert job.status == "finished" and job.summary is not None and job.result is None
        assert env.get(first.rollout_id, detail="full").result.reward == 1.0
    assert runs_of(policy_server, "resubmit") == 1


def test_busy_is_refused_then_waited_out_never_lost(start_server, policy_server) -> None:
    server = start_server("--max-concurrent", "1", "--max-queue", "0")
    with HarnessEnv(server.url) as env:
        slow = env.submit(hello_rollout(policy_server, "busy-slow", [{"bash": "sleep 3; echo hello > hello.txt"}, {"text": "done"}]))
        with pytest.raises(HarnessEnvClientError) as refused:
            env.submit(hello_rollout(policy_server, "busy-refused"))
        assert refused.value.status == 429
        requests = [hello_rollout(policy_server, f"busy-{i}") for i in range(3)]
        results = list(env.run_many(requests, concurrency=3))  # all three are refused at first: the server is full
        assert sorted(r.reward for r in results) == [1.0, 1.0, 1.0] and all(r.error is None for r in results)
        assert env.wait(slow.rollout_id).reward == 1.0
    assert [runs_of(policy_server, f"busy-{i}") for i in range(3)] == [1, 1, 1] and runs_of(policy_server, "busy-refused") == 0
    listed = httpx.get(server.url + "/rollouts").json()["items"]
    assert len(listed) == 4 and {i["status"] for i in listed} == {"finished"}


async def test_async_client_submit_events_wait_and_a_cut_mid_events(server, policy_server) -> None:
    proxy = CuttableProxy(server.port)
    try:
        async with AsyncHarnessEnv(proxy.url, reconnect_for_s=60) as env:
            script = [{"bash": "echo one"}, {"bash": "sleep 3"}, {"bash": "echo hello > hello.txt"}, {"text": "done"}]
            accepted = await env.submit(hello_rollout(policy_server, "async-events", script))
            seen: list[PhaseEvent | JobEnd] = []
            async for ev in env.events(accepted.rollout_id):
                seen.append(ev)
                if isinstance(ev, PhaseEvent) and ev.phase == "agent" and ev.status == "started":
                    assert proxy.cut(down_for_s=1) >= 1  # mid-stream: it reconnects and resumes
            assert isinstance(seen[-1], JobEnd) and seen[-1].status == "finished" and seen[-1].reward == 1.0
            phases = [(e.phase, e.status, e.detail) for e in seen[:-1]]
            assert len(phases) == len(set(phases)), "an event came twice"  # resumed after the last one seen
            assert [p[:2] for p in phases[:3]] == [("queue", "started"), ("queue", "finished"), ("endpoint", "started")]
            assert phases[-1][:2] == ("done", "finished")
            stored = (await env.get(accepted.rollout_id)).events
            assert stored == len(phases)  # none missed
            result = await env.wait(accepted.rollout_id, timeout=30)
            assert result.reward == 1.0 and len(result.proxy_turns) == 4
            assert [r.reward async for r in env.run_many([hello_rollout(policy_server, "async-many")])] == [1.0]
            with pytest.raises(HarnessEnvClientError) as missing:
                await env.get("0123456789abcdef")
            assert missing.value.status == 404
        assert runs_of(policy_server, "async-events") == 1
    finally:
        proxy.close()


async def test_bad_arguments_and_unknown_ids_are_one_clear_error_and_run_many_files_them_as_invalid(server, policy_server) -> None:
    good = hello_rollout(policy_server, "clear-errors")
    bad = {**good, "max_turns": 0}
    with HarnessEnv(server.url) as env:
        for call in (env.run_rollout, env.submit):
            with pytest.raises(HarnessEnvClientError) as refused:
                call(bad)
            assert (refused.value.status, str(refused.value)) == (422, "422: invalid request: max_turns: Input should be greater than or equal to 1")
        with pytest.raises(HarnessEnvClientError) as listed:
            env.list_rollouts(status=["lost"])  # refused by the server itself: its list of problems, as one line
        assert listed.value.status == 422 and listed.value.message.startswith("invalid request: status") and "\n" not in listed.value.message
        for rollout_id in ("0123456789ab", "not-an-id"):
            for call in (env.get, env.wait, env.cancel, lambda i: list(env.events(i))):
                with pytest.raises(HarnessEnvClientError) as missing:
                    call(rollout_id)
                assert missing.value.status == 404 and "no rollout" in missing.value.message, missing.value
        results = list(env.run_many([bad, good], concurrency=2))
        assert sorted((r.error_kind or "-", r.reward) for r in results) == [("-", 1.0), ("invalid_request", None)]
    async with AsyncHarnessEnv(server.url) as aenv:
        [refused_result] = [r async for r in aenv.run_many([bad])]
        assert refused_result.error_kind == "invalid_request" and "max_turns" in (refused_result.error or "")
        with pytest.raises(HarnessEnvClientError) as missing:
            await aenv.get("not-an-id")
        assert missing.value.status == 404
    assert runs_of(policy_server, "clear-errors") == 1
