"""`harness-env serve --ray` on a real two-node Ray cluster (Ray's own cluster_utils: two raylets on
this machine) with a real PostgreSQL store: two replicas, rollouts landing on both (the result
names the replica and node), a cancel sent through the other replica, a replica killed mid-rollout
(its rollout ends `interrupted`, reward None, and Ray Serve replaces it), and nothing left behind:
no Ray process, no sandbox directory, no temporary file."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest
import ray.exceptions
from ray.cluster_utils import Cluster
from ray.serve.schema import ProxyStatus

from harness_env.cli import main as cli_main
from harness_env.core.sandbox.processes import marked_pids
from harness_env.server.jobs.upkeep import remove_sandbox
from harness_env.server.ray import serve as ray_serve
from harness_env.server.ray.serve import REPLICA_HEADER, BadRayArgs, CaptureOnly, build, start_serve
from harness_env.server.ray.settings import capture_address
from tests.fakes.policy import hello_rollout
from tests.server.jobs.test_manager import SLOW, agent_started, wait_for
from tests.server_process import ServerProcess

# How long the command may take to come up. In CI (three workers on two cores) Ray's own start took
# over two minutes (its controller, a proxy replaced while starting, then the replicas): the test
# waits as long as the command itself waits for its proxy, plus the replicas' start.
UP_S = ray_serve.PROXY_START_S + 120
BUSY_S = 300  # what a request may wait on a busy machine (a replica starting, a rollout) before the test gives up
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(UP_S + 240)]
HEADER = REPLICA_HEADER.decode()
TOKEN = "ray-token-never-shown"
# A rollout that takes a couple of seconds, so concurrent ones overlap and spread over replicas.
BRIEF = [{"bash": "sleep 2; env > env.txt; echo hello > hello.txt"}, {"text": "done"}]
# One that outlasts a replica's death and its replacement's start on the other replica.
# Long enough to outlast submitting and waiting for every job on a busy machine (20 s did not).
SURVIVES = [{"bash": "sleep 45; echo hello > hello.txt"}, {"text": "done"}]
# Its sleep within the bash tool's time (60 s by default) on a machine busy with a replica's death
# and another's start: a busy check once saw it end with reward 0 and no error.
UNHURRIED = {"harness_config": {"tool_timeout_s": 300}, "agent_timeout_s": BUSY_S}


@dataclass
class RayApp:
    server: ServerProcess  # the `harness-env serve --ray` driver; its URL is Ray Serve's proxy
    cluster: Cluster
    store_url: str
    sandboxes: Path

    @property
    def node_ids(self) -> set[str]:
        return {n.node_id for n in self.cluster.list_all_nodes()}


def ray_processes(temp_dir: str) -> list[str]:
    """Processes of the cluster whose files are under `temp_dir` (every Ray process names its session there)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or ())
        if temp_dir in cmd:
            found.append(f"{p.info['pid']} {cmd[:200]}")
    return found


@pytest.fixture(scope="module")
def ray_app(tmp_path_factory, postgres_server) -> Iterator[RayApp]:
    root = tmp_path_factory.mktemp("ray")
    sandboxes, replica_tmp = root / "sandboxes", root / "tmp"
    sandboxes.mkdir()
    (replica_tmp / "ray").mkdir(parents=True)  # where Ray notes the cluster's address (TMPDIR/ray), removed at shutdown
    # Short: Ray's Unix sockets live under it (sun_path holds 107 bytes).
    temp_dir = tempfile.mkdtemp(prefix="rt-", dir="/tmp")
    store_url = postgres_server.new_database()
    # What every node's environment carries, as a cluster's nodes would (Kubernetes: the pod's env):
    # the nodes inherit this process's environment when they start.
    node_env = {
        "HARNESS_ENV_STORE_URL": store_url,
        "HARNESS_ENV_SANDBOX_DIR": str(sandboxes),
        "TMPDIR": str(replica_tmp),
        "HARNESS_ENV_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "HARNESS_ENV_LOG_LEVEL": "warning",
        # One proxy (the head's): spread its requests over both nodes' replicas.
        "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",
        # What docs/deploy.md advises for a busy cluster: a slow proxy is waited for, not replaced.
        ray_serve.PROXY_READY_VAR: ray_serve.PROXY_READY_CHECK_S,
        ray_serve.NICENESS_VAR: ray_serve.NICENESS,
        # Ray on loopback only: a driver or worker would otherwise turn 127.0.0.1 into the host's own address.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    saved = {k: os.environ.get(k) for k in node_env}
    os.environ.update(node_env)
    cluster = server = None
    try:
        # Loopback only; one CPU a node (so one replica a node); a small object store, no dashboard UI.
        small = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024, "node_ip_address": "127.0.0.1"}
        cluster = Cluster(initialize_head=True, head_node_args={**small, "include_dashboard": False, "temp_dir": temp_dir})
        cluster.add_node(**small)
        cluster.wait_for_nodes()
        started = time.monotonic()
        server = ServerProcess(
            sandboxes,
            "--ray",
            "--ray-address",
            cluster.address,
            "--replicas",
            "2",
            env={"HARNESS_ENV_STORE_URL": store_url},
            start_timeout_s=UP_S,
            stop_timeout_s=60,
        )
        # Up when Ray Serve's proxy routes to both replicas (it learns of each a moment after it runs).
        answered: set[str] = set()
        while len(answered) < 2 and time.monotonic() < started + UP_S:
            answered.add(httpx.get(server.url + "/health", timeout=10).headers[HEADER])
            time.sleep(0.1)
        assert len(answered) == 2, f"only replica(s) {answered} answer"
        print(f"two replicas up in {time.monotonic() - started:.1f}s", file=sys.stderr)
        yield RayApp(server, cluster, store_url, sandboxes)
    finally:
        log = server.stop() if server is not None else ""
        if cluster is not None:
            cluster.shutdown()  # it removes TMPDIR/ray/ray_current_cluster: before TMPDIR is restored
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        deadline = time.monotonic() + 30
        while ray_processes(temp_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = ray_processes(temp_dir)
        for line in left:  # only when something failed (a node that did not start): ended, then reported
            psutil.Process(int(line.split()[0])).kill()
        for name in os.listdir(sandboxes):  # only when a test failed: no process or mount outlives it
            if not name.endswith(".lease"):
                remove_sandbox(str(sandboxes / name))
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert left == [], f"Ray processes left behind: {left}"
        assert "Traceback" not in log and (server is None or server.proc.returncode == 0), log[-4000:]
        assert os.listdir(sandboxes) == []
        assert [p.name for p in replica_tmp.rglob("*")] == ["ray"], "a replica left temporary files behind"


def called(app: RayApp, body: dict, out: list) -> threading.Thread:
    """POST /rollout in a thread (it waits for the result); (result, the replica that answered) into `out`."""

    def go() -> None:
        r = httpx.post(app.server.url + "/rollout", json=body, timeout=BUSY_S)
        out.append((r.json(), r.headers.get(HEADER)))

    t = threading.Thread(target=go)
    t.start()
    return t


def spread_over_replicas(app: RayApp, policy_server, waves: int = 3) -> list:
    """Waves of 4 overlapping rollouts until both replicas have run one (or `waves` are spent).

    Ray Serve's router picks by the queue lengths it last heard, and on a busy machine a wave can
    land whole on one replica before it hears of the first request; a second wave sees it busy."""
    out: list = []
    for wave in range(waves):
        threads = []
        for i in range(4):
            threads.append(called(app, hello_rollout(policy_server, f"ray-brief-{wave}-{i}", BRIEF), out))
            time.sleep(0.3)  # the router hears of the one before
        for t in threads:
            t.join()
        if len({replica for _, replica in out}) == 2:
            break
    return out


def test_two_replicas_on_two_nodes_share_the_load_and_the_store(ray_app, policy_server) -> None:
    out = spread_over_replicas(ray_app, policy_server)
    results = [r for r, _ in out]
    assert [r["reward"] for r in results] == [1.0] * len(results), [r.get("error") for r in results]
    # The node's secrets stay in the replica: the sandbox's environment has neither the store nor Ray's.
    for r in results:
        names = {line.split("=", 1)[0] for line in r["files"]["env.txt"].splitlines() if "=" in line}
        assert "hello" in r["files"]["hello.txt"] and not {"HARNESS_ENV_STORE_URL", "HARNESS_ENV_TOKEN"} & names
        assert ray_app.store_url not in r["files"]["env.txt"] and not [n for n in names if n.startswith("RAY_")], sorted(names)
    # Captured through each replica's own proxy: the engine's token ids, every turn.
    assert all(r["proxy_turns"] and r["proxy_turns"][0]["completion_token_ids"] for r in results)
    served = [r["served_by"] for r in results]
    assert len({s["replica"] for s in served}) == 2, served
    assert {s["node"] for s in served} == ray_app.node_ids  # one replica on each node
    assert all(s["replica"] == replica for s, (_, replica) in zip(served, out))  # the answer came from the replica that ran it
    # Any replica reads any rollout: the shared store.
    for r in results:
        read = httpx.get(f"{ray_app.server.url}/rollouts/{r['rollout_id']}", params={"detail": "full"})
        assert read.json()["status"] == "finished" and read.json()["result"]["served_by"] == r["served_by"]
    listed = {i["rollout_id"] for i in httpx.get(ray_app.server.url + "/rollouts", params={"limit": 50}).json()["items"]}
    assert {r["rollout_id"] for r in results} <= listed


def test_cancel_sent_to_the_other_replica_reaches_the_rollout(ray_app, policy_server) -> None:
    out: list = []
    t = called(ray_app, hello_rollout(policy_server, "ray-cancel", SLOW), out)  # a called rollout: one request in flight on its replica
    url = ray_app.server.url
    deadline = time.monotonic() + 60
    running: list = []
    while not running and time.monotonic() < deadline:
        running = httpx.get(url + "/rollouts", params={"status": "running"}).json()["items"]
        time.sleep(0.2)
    assert running, "the rollout did not start"
    rid = running[0]["rollout_id"]
    assert agent_started(wait_for(ray_app.server, rid, agent_started))
    # Ray Serve sends the cancel to the replica with fewer requests in flight: the other one.
    cancel = httpx.delete(f"{url}/rollouts/{rid}", timeout=30)
    assert cancel.status_code == 200
    t.join(timeout=60)
    result, owner = out[0]
    assert cancel.headers[HEADER] != owner, "the cancel went to the replica that runs the rollout; this test needs the other"
    assert result["served_by"]["replica"] == owner and result["reward"] is None
    job = wait_for(ray_app.server, rid, lambda j: j["status"] == "cancelled", timeout=30)
    assert job["status"] == "cancelled" and job["reward"] is None


def _replica_pid(store_url: str, rollout_id: str) -> int:
    """The process of the replica that runs a rollout, as the store knows it (its heartbeat row)."""
    with psycopg.connect(store_url) as conn:
        row = conn.execute("SELECT i.pid FROM rollouts r JOIN instances i ON i.id = r.instance WHERE r.id = %s", (rollout_id,)).fetchone()
    assert row is not None, "the rollout's replica is not in the store"
    return row[0]


def test_a_killed_replica_s_rollouts_end_interrupted_and_ray_serve_replaces_it(ray_app, policy_server) -> None:
    url = ray_app.server.url
    submitted = httpx.post(url + "/rollouts", json=hello_rollout(policy_server, "ray-kill", SLOW))
    assert submitted.status_code == 202
    rid, victim = submitted.json()["rollout_id"], submitted.headers[HEADER]
    # And one running on the other replica, which must go on: only the dead replica's rollouts end.
    # A job the router gives the victim instead is cancelled at once: left to queue behind the
    # victim's two running places, it would start only once one of them ends (and CI once saw the
    # router give the victim eight in a row).
    on_victim, survivor, cancelled = [rid], None, []
    for i in range(12):
        job = httpx.post(url + "/rollouts", json=hello_rollout(policy_server, f"ray-survive-{i}", SURVIVES, **UNHURRIED))
        if job.headers[HEADER] != victim:
            survivor = job.json()["rollout_id"]
            break
        cancelled.append(job.json()["rollout_id"])
        assert httpx.delete(f"{url}/rollouts/{cancelled[-1]}", timeout=30).status_code == 200
    assert survivor is not None, "every job went to one replica"
    for job_id in cancelled:
        assert wait_for(ray_app.server, job_id, lambda j: j["status"] == "cancelled")["status"] == "cancelled"
    for job_id in (*on_victim, survivor):
        assert agent_started(wait_for(ray_app.server, job_id, agent_started))
    deadline = time.monotonic() + 30  # a cancelled job's sandbox may still be on its way out
    while len(sandboxes := {p.name for p in ray_app.sandboxes.iterdir() if not p.name.endswith(".lease")}) > 2:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(sandboxes) == len(on_victim) + 1 and all(marked_pids(name) for name in sandboxes)
    os.kill(_replica_pid(ray_app.store_url, rid), 9)  # the replica's worker process dies, as in a crash

    for job_id in on_victim:
        job = wait_for(ray_app.server, job_id, lambda j: j["status"] != "running", timeout=60)
        assert job["status"] == "interrupted" and job["reward"] is None and job["error_kind"] == "internal", job
        result = httpx.get(f"{url}/rollouts/{job_id}", params={"detail": "full"}).json()["result"]
        assert result["reward"] is None and "stopped before it ended" in result["error"]
        # Its sandbox is removed by a replica on the same host, its processes killed.
        assert result["sandbox_notes"] == ["clean-up after the server died: sandbox directory removed"]
    assert len([p for p in ray_app.sandboxes.iterdir() if not p.name.endswith(".lease")]) == 1  # the survivor's, still running

    # Ray Serve starts a new replica in its place: two replicas serve again, one of them new.
    deadline, replicas = time.monotonic() + BUSY_S, set()
    while time.monotonic() < deadline:
        out: list = []
        threads = [called(ray_app, hello_rollout(policy_server, f"ray-after-{i}", BRIEF), out) for i in range(2)]
        for t in threads:
            t.join()
        assert all(r["reward"] == 1.0 for r, _ in out), [r.get("error") for r, _ in out]
        replicas |= {r["served_by"]["replica"] for r, _ in out}
        if len({r["served_by"]["replica"] for r, _ in out}) == 2 and victim not in replicas:
            break
        time.sleep(2)
    assert len(replicas) >= 2 and victim not in replicas, replicas
    # The other replica's rollout was never taken for dead, not even by the new replica starting.
    kept = wait_for(ray_app.server, survivor, lambda j: j["status"] != "running", timeout=60)
    assert kept["status"] == "finished" and kept["reward"] == 1.0, (kept["reward"], kept.get("error"), kept.get("error_kind"))
    assert all(not (ray_app.sandboxes / name).exists() for name in sandboxes)
    assert [pid for name in sandboxes for pid in marked_pids(name)] == []


def test_serve_ray_alone_starts_a_local_cluster_and_stops_it(tmp_path_factory, policy_server, postgres_server) -> None:
    """Without --ray-address: a local Ray cluster, started and stopped by the command itself; with
    a token, which every replica asks for and which reaches neither a sandbox nor a result."""
    root = tmp_path_factory.mktemp("local")
    sandboxes = root / "sandboxes"
    sandboxes.mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="rl-", dir="/tmp")  # short: Ray's sockets are under it
    server = None
    try:
        server = ServerProcess(
            sandboxes,
            "--ray",
            "--token",
            TOKEN,
            start_timeout_s=UP_S,
            stop_timeout_s=60,
            env={"HARNESS_ENV_STORE_URL": postgres_server.new_database(), "RAY_TMPDIR": ray_tmp},
        )
        body = hello_rollout(policy_server, "ray-local", [{"bash": "nice > nice.txt; env > env.txt; echo hello > hello.txt"}, {"text": "done"}])
        assert httpx.post(server.url + "/rollout", json=body, timeout=BUSY_S).status_code == 401
        r = httpx.post(server.url + "/rollout", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=BUSY_S)
        assert r.json()["reward"] == 1.0 and r.json()["served_by"]["replica"] == r.headers[HEADER], r.json().get("error")
        assert "hello" in r.json()["files"]["hello.txt"] and TOKEN not in r.text  # env.txt: the sandbox's environment
        assert r.json()["files"]["nice.txt"].strip() == "0"  # not Ray's nice 15 for workers: a busy machine would starve it
    finally:
        log = server.stop() if server is not None else ""
        deadline = time.monotonic() + 30
        while ray_processes(ray_tmp) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = ray_processes(ray_tmp)
        for line in left:  # only when the command failed to stop them: ended, then reported
            psutil.Process(int(line.split()[0])).kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert server.proc.returncode == 0 and "Traceback" not in log, log[-4000:]
    assert left == [], f"the local Ray cluster was left running: {left}"
    assert os.listdir(sandboxes) == []


# How `serve.start` fails on a proxy slow to start: its controller killed it (to start another), or
# it was not ready within serve.start's own 60 s (both seen on a busy machine).
SLOW_PROXY = [ray.exceptions.ActorDiedError(), TimeoutError("HTTP proxies not available after 60s.")]


class SlowProxyServe:
    """Ray Serve as it behaves when its HTTP proxy is slow to start: the first start fails with
    `failure`, and the proxy is STARTING for `starting` looks. Real Ray does this only by the
    timing of a busy machine (CI's); forcing it with a tiny RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S
    kills every replacement too."""

    def __init__(self, starting: int, failure: Exception) -> None:
        self.starts = 0
        self.looks = 0
        self.starting = starting
        self.failure = failure

    def start(self, **_: object) -> None:
        self.starts += 1
        if self.starts == 1:
            raise self.failure

    def status(self) -> object:
        self.looks += 1
        up = ProxyStatus.HEALTHY if self.looks > self.starting else ProxyStatus.STARTING
        return type("Status", (), {"proxies": {"node": up}})()


@pytest.mark.parametrize("failure", SLOW_PROXY, ids=["killed", "not-ready-in-60s"])
def test_a_proxy_slow_to_start_is_waited_for(monkeypatch, capsys, failure) -> None:
    fake = SlowProxyServe(starting=2, failure=failure)
    monkeypatch.setattr(ray_serve, "serve", fake)
    start_serve("127.0.0.1", 1, threading.Event())
    assert fake.looks == 3 and "HTTP proxy is slow to start; waiting for it" in capsys.readouterr().err

    fake = SlowProxyServe(starting=10**9, failure=failure)  # never up: one clear error once the wait is over
    monkeypatch.setattr(ray_serve, "serve", fake)
    with pytest.raises(RuntimeError, match=r"HTTP proxy did not start in 1s \(see Ray's logs\)"):
        start_serve("127.0.0.1", 1, threading.Event(), timeout_s=1)
    fake = SlowProxyServe(starting=10**9, failure=failure)
    monkeypatch.setattr(ray_serve, "serve", fake)
    stop = threading.Event()
    stop.set()  # a stop asked for while waiting ends the wait, long before its end
    start_serve("127.0.0.1", 1, stop)
    assert fake.starts == 2 and fake.looks == 1


def test_bad_ray_settings_get_one_clear_error(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("HARNESS_ENV_STORE_URL", raising=False)

    cases = {
        ("--ray", "--replicas", "0"): "--replicas must be at least 1",
        ("--ray", "--replicas", "2", "--min-replicas", "1", "--max-replicas", "3"): "not both",
        ("--ray", "--min-replicas", "1"): "needs both --min-replicas and --max-replicas",
        ("--ray", "--min-replicas", "3", "--max-replicas", "2"): "at most --max-replicas",
        ("--replicas", "2"): "--replicas is a Ray setting: add --ray",
        ("--ray", "--data-dir", str(tmp_path)): "share HARNESS_ENV_STORE_URL=postgresql://",
        ("--ray",): "set HARNESS_ENV_STORE_URL=postgresql://",  # checked before any Ray process starts
    }
    for argv, message in cases.items():
        with pytest.raises(SystemExit) as exited:
            cli_main(["serve", *argv])  # in this process: nothing but the flags' checks runs, no Ray
        stderr = capsys.readouterr().err
        assert exited.value.code == 2 and message in stderr, (argv, stderr)
        assert len(stderr.strip().splitlines()) == 1, stderr
    with pytest.raises(BadRayArgs, match="max_concurrent: Input should be greater than or equal to 1"):
        build({"max_concurrent": 0})
    with pytest.raises(BadRayArgs, match="replicas: Extra inputs are not permitted"):
        build({"replicas": 2})  # replica counts belong to serveConfigV2's deployment, not the args


async def test_a_replica_s_capture_listener_serves_the_capture_routes_only() -> None:
    """The loopback listener a replica's harnesses call: /capture reaches the app, nothing else of
    its API does (a sandbox must not reach /rollouts or /web through it)."""
    seen: list[str] = []

    async def app(scope, receive, send) -> None:
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    listener = CaptureOnly()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=listener), base_url="http://replica") as client:
        assert (await client.get("/capture/v1/models")).status_code == 404  # not built yet
        listener.app = app
        assert (await client.get("/capture/v1/models")).text == "ok"
        for path in ("/rollouts", "/web", "/health", "/capturex/v1/models", "/"):
            answer = await client.get(path)
            assert answer.status_code == 404 and "only the capture proxy" in answer.json()["error"]["message"], path
    assert seen == ["/capture/v1/models"]
    # Loopback unless the node names the address off-node sandboxes reach it at.
    assert capture_address({}) == ("127.0.0.1", "127.0.0.1")
    assert capture_address({"HARNESS_ENV_NODE_HOST": "node-7.cluster.local"}) == ("0.0.0.0", "node-7.cluster.local")
