"""Issue 18's sandbox attacks through a real `harness-env serve`: the reward is not forged, the
server keeps answering /health while a rollout attacks it, the sandbox cannot reach the server's
own API, and nothing is left behind."""

from __future__ import annotations

import asyncio
import threading
from urllib.parse import urlsplit

import httpx
import pytest

from tests.core.test_engine_attacks import FIFO_FORGE, LINK_FORGE

pytestmark = pytest.mark.e2e


def _body(policy_server, harness: str, verify: list[str], **kw) -> dict:
    return {
        "harness": harness,
        "instruction": "do it",
        "verify": verify,
        "base_url": policy_server.base_url,
        "model": "m",
        "agent_timeout_s": 60,
        "verify_timeout_s": 20,
        **kw,
    }


class HealthWatch:
    """Polls /health every 0.2 s in a thread; counts the answers given while rollouts ran, and the
    polls that got none (a loop held by the attack would not answer)."""

    def __init__(self, url: str) -> None:
        self.url, self.answered_while_running, self.failures = url, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                r = httpx.get(self.url + "/health", timeout=30)
                r.raise_for_status()
                self.answered_while_running += r.json()["rollouts_running"] > 0
            except httpx.HTTPError:
                self.failures += 1
            self._stop.wait(0.2)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize("harness", ["whitebox", "pi"])
def test_link_and_fifo_forgery_through_the_server(start_server, policy_server, harness):
    server = start_server()
    # the last answer waits 1.5 s, so the watch polls while the rollout runs even on a fast machine
    policy_server.policy.scripts["m"] = [{"bash": LINK_FORGE + "; " + FIFO_FORGE}, {"hang": 1.5, "text": "done"}]
    with HealthWatch(server.url) as watch:
        r = httpx.post(server.url + "/rollout", json=_body(policy_server, harness, ["false"]), timeout=180)
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["error"] is None, res["error"]
    assert res["reward"] == 0.0 and res["reward_source"] == "verify_ratio"
    assert watch.failures == 0 and watch.answered_while_running > 0, (watch.failures, watch.answered_while_running)
    server.assert_no_rollout_left()
    server.proc.terminate()  # SIGTERM is obeyed at once (the fixture then checks the server's TMPDIR)
    assert server.proc.wait(timeout=15) is not None
    assert "Traceback" not in server.log_path.read_text()


def test_whitebox_reads_of_fifos_do_not_starve_the_server(start_server, policy_server):
    server = start_server("--max-concurrent", "8")
    policy_server.policy.scripts["m"] = [{"bash": "mkfifo pipe"}, {"call": "read", "arguments": '{"path": "pipe"}'}, {"text": "done"}]
    policy_server.policy.scripts["ok"] = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]

    async def storm() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=180) as client:
            fifo = [client.post(server.url + "/rollout", json=_body(policy_server, "whitebox", ["true"])) for _ in range(8)]
            return await asyncio.gather(*fifo)

    with HealthWatch(server.url) as watch:
        answers = asyncio.run(storm())
        after = httpx.post(server.url + "/rollout", json={**_body(policy_server, "whitebox", ["grep -qx hello hello.txt"]), "model": "ok"}, timeout=60)
    assert all(a.status_code == 200 and a.json()["reward"] == 1.0 for a in answers), [a.text[:300] for a in answers]
    assert after.status_code == 200 and after.json()["reward"] == 1.0
    assert watch.failures == 0 and watch.answered_while_running > 0, (watch.failures, watch.answered_while_running)
    server.assert_no_rollout_left()


def test_the_sandbox_cannot_reach_the_servers_api_or_the_policy(start_server, policy_server):
    server = start_server()
    server_port, policy_port = urlsplit(server.url).port, urlsplit(policy_server.base_url).port
    probe = (
        f"(exec 3<>/dev/tcp/127.0.0.1/{server_port}) 2>/dev/null && echo SERVER-REACHED > net.txt; "
        f"(exec 3<>/dev/tcp/127.0.0.1/{policy_port}) 2>/dev/null && echo POLICY-REACHED >> net.txt; "
        # through the one way out: the capture proxy answers its own routes only
        "(exec 3<>/dev/tcp/127.0.0.1/18080 && printf 'GET /health HTTP/1.0\\r\\n\\r\\n' >&3 && head -1 <&3) > proxy.txt 2>&1; "
        "(exec 3<>/dev/tcp/127.0.0.1/18080 && printf 'POST /rollout HTTP/1.0\\r\\nContent-Length: 2\\r\\n\\r\\n{}' >&3 && head -1 <&3) >> proxy.txt 2>&1; "
        "touch net.txt; true"
    )
    policy_server.policy.scripts["m"] = [{"bash": probe}, {"text": "done"}]
    r = httpx.post(server.url + "/rollout", json=_body(policy_server, "whitebox", ["true"]), timeout=120)
    res = r.json()
    assert res["error"] is None, res["error"]
    assert res["files"]["net.txt"].strip() == ""
    statuses = [line.split()[1] for line in res["files"]["proxy.txt"].splitlines() if line.startswith("HTTP/")]
    assert statuses == ["404", "404"], res["files"]["proxy.txt"]
    assert res["proxy_turns"] and res["capture_level"] == "tokens"  # the harness itself got through
    server.assert_no_rollout_left()


def test_a_deep_tree_through_the_server_is_cleaned_up(start_server, policy_server):
    server = start_server()
    policy_server.policy.scripts["m"] = [{"bash": "D=$(printf 'd/%.0s' $(seq 1500)); mkdir -p $D && cd $D && fallocate -l 512M big.bin"}, {"text": "done"}]
    r = httpx.post(server.url + "/rollout", json=_body(policy_server, "whitebox", ["test -f " + "d/" * 1500 + "big.bin"]), timeout=180)
    assert r.status_code == 200 and r.json()["reward"] == 1.0, r.text[:500]
    server.assert_no_rollout_left()


def test_server_secrets_echoed_by_the_upstream_are_masked(start_server, policy_server):
    token, judge_key = "tok-server-secret-51c7e2", "judge-key-secret-9a04b1"
    server = start_server(
        "--token", token, env={"HARNESS_ENV_JUDGE_API_KEY": judge_key, "HARNESS_ENV_JUDGE_BASE_URL": "http://127.0.0.1:9/v1", "HARNESS_ENV_JUDGE_MODEL": "j"}
    )
    body = f'{{"error": {{"message": "bad key; the server uses {token} and {judge_key}"}}}}'
    policy_server.policy.scripts["m"] = [{"raw": body, "status": 401}]
    r = httpx.post(server.url + "/rollout", json=_body(policy_server, "whitebox", ["true"]), headers={"Authorization": f"Bearer {token}"}, timeout=120)
    assert r.status_code == 200, r.text
    assert token not in r.text and judge_key not in r.text and "[redacted]" in r.text
    server.assert_no_rollout_left()


def test_limits_over_the_servers_maximum_are_a_422(start_server, policy_server):
    server = start_server(env={"HARNESS_ENV_MAX_MEMORY_LIMIT_MB": "1024", "HARNESS_ENV_MAX_CPU_LIMIT": "2"})
    for extra, field in (
        ({"memory_limit_mb": 4096, "cpu_limit": 1}, "memory_limit_mb=4096"),
        ({"memory_limit_mb": 512, "cpu_limit": 4}, "cpu_limit=4"),
        ({"memory_limit_mb": 512}, "cpu_limit=no cap"),
    ):
        r = httpx.post(server.url + "/rollout", json={**_body(policy_server, "whitebox", ["true"]), **extra}, timeout=30)
        assert r.status_code == 422 and field in r.json()["detail"], r.text
    ok = httpx.post(server.url + "/rollout", json={**_body(policy_server, "whitebox", ["true"]), "memory_limit_mb": 512, "cpu_limit": 1}, timeout=60)
    assert ok.status_code == 200 and ok.json()["error"] is None, ok.text[:500]
    server.assert_no_rollout_left()
