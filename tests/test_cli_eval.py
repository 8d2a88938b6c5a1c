"""`harness-env eval` and `export` as a user runs them: the white-box harness against a policy
scripted per task, so the pass@k and means are known by hand; resume after a kill; the dataset loads."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from harness_env.core.sandbox.host import mounts_at_or_below
from tests.fakes.policy import FakePolicy, FakePolicyServer

pytestmark = pytest.mark.slow  # the eval CLI in processes of its own: not in the fast tier

CLI = [sys.executable, "-m", "harness_env.cli"]
WRITE = {"bash": "echo ok > out.txt"}
STOP = {"text": "done"}


class PerTaskPolicy(FakePolicy):
    """Scripts by the task named in the instruction ("[task NAME]"), and counts the rollouts of each
    task (conversations started: requests with tools and no assistant message yet). Task `half`
    writes the file on its even-numbered rollouts only, so half of its attempts pass."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.started: Counter[str] = Counter()
        self.lock = threading.Lock()

    def _step(self, body):
        if not body.get("tools"):
            return super()._step(body)
        user = next((m for m in body.get("messages", []) if m.get("role") == "user"), {})
        text = str(user.get("content"))
        task = text.split("[task ", 1)[1].split("]", 1)[0] if "[task " in text else ""
        n = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        if n == 0:
            with self.lock:
                self.started[task] += 1
                rollout = self.started[task]
            if task == "half":
                return WRITE if rollout % 2 == 1 else STOP
        if task == "down":
            return {"status": 500}
        if task == "slow" and n == 0:
            return {**WRITE, "hang": 0.4}
        return {"always": WRITE, "slow": WRITE, "partial": WRITE}.get(task, STOP) if n == 0 else STOP


def _task(name, verify):
    return {"task_id": name, "instruction": f"[task {name}] write out.txt", "verify": verify}


TASKS = [
    _task("always", ["test -f out.txt"]),
    _task("never", ["test -f out.txt"]),
    _task("half", ["test -f out.txt"]),
    _task("partial", ["test -f out.txt", "false"]),  # reward 0.5 every time: never passes at threshold 1.0
    _task("down", ["test -f out.txt"]),  # the endpoint answers 500: an infrastructure failure, reward null
]


@pytest.fixture
def policy():
    with FakePolicyServer(PerTaskPolicy()) as srv:
        yield srv


def _eval(policy, tasks_path, out, *extra, env=None, **kw):
    return subprocess.Popen(
        [*CLI, "eval", str(tasks_path), "--harness", "whitebox", "--base-url", policy.base_url, "--model", "m", "--out", str(out), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kw,
    )


def _write_jsonl(path, tasks):
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def test_eval_gives_the_hand_computed_pass_at_k_and_means_and_exports_a_dataset(tmp_path, policy):
    tasks = _write_jsonl(tmp_path / "tasks.jsonl", TASKS)
    p = _eval(policy, tasks, tmp_path / "run", "-n", "4", "--concurrency", "4")
    stdout, stderr = p.communicate(timeout=240)
    assert p.returncode == 0, stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    t = summary["tasks"]
    # By hand: pass@k = 1 - C(n-c, k)/C(n, k) with n = 4.
    assert t["always"]["pass_at_k"] == {"1": 1.0, "2": 1.0, "3": 1.0, "4": 1.0}
    assert t["never"]["pass_at_k"] == {"1": 0.0, "2": 0.0, "3": 0.0, "4": 0.0}
    assert t["partial"]["pass_at_k"] == {"1": 0.0, "2": 0.0, "3": 0.0, "4": 0.0}
    half = t["half"]["pass_at_k"]
    assert half["1"] == pytest.approx(1 - 2 / 4) and half["2"] == pytest.approx(1 - 1 / 6) and half["3"] == half["4"] == 1.0
    assert [t[n]["mean_reward"] for n in ("always", "never", "half", "partial")] == [1.0, 0.0, 0.5, 0.5]
    assert t["half"]["stderr"] == pytest.approx(math.sqrt((1 / 3) / 4)) and t["always"]["stderr"] == 0.0
    o = summary["overall"]
    assert o["pass_at_k"]["1"] == pytest.approx((1 + 0 + 0.5 + 0) / 4) and o["pass_at_k"]["2"] == pytest.approx((1 + 5 / 6) / 4)
    assert o["mean_reward"] == pytest.approx((4 * 1 + 0 + 2 * 1 + 4 * 0.5) / 16) and (o["scored"], o["infra_failures"]) == (16, 4)
    down = t["down"]  # shown apart, in no denominator
    assert (down["scored"], down["infra_failures"], down["mean_reward"], down["errors"]) == (0, 4, None, {"endpoint": 4})
    assert set(down["pass_at_k"].values()) == {None} and o["errors"]["endpoint"] == 4
    del policy.policy.started["down"]  # the engine retries an answer of 500: more than one call per attempt
    assert policy.policy.started == {"always": 4, "never": 4, "half": 4, "partial": 4}
    assert "pass@4" in stdout and "overall" in stdout and "0.500 ± 0.289" in stdout
    assert "20/20 done" in stderr and "4 failed" in stderr and "4 of 20 attempts" in stdout
    # Not a terminal: plain progress lines, with the running mean reward and, once known, an ETA.
    lines = [line for line in stderr.splitlines() if line.startswith("[eval] ")]
    assert "\r" not in stderr and any("running" in line and "mean reward 0." in line and "ETA" in line for line in lines), stderr
    # One headline at the end: pass@1 over the graded tasks (1, 0, 0.5, 0) with its standard error.
    se = math.sqrt(sum((v - 0.375) ** 2 for v in (1, 0, 0.5, 0)) / 3 / 4)
    assert stdout.rstrip().splitlines()[-1] == (
        f"pass@1 0.375 ± {se:.3f} over 4 graded tasks of 5 (mean reward 0.500); infrastructure failures: 4 of 20 attempts"
    )
    # The messages behind each error kind, read from the attempts' results.
    messages = {json.loads(f.read_text())["error"] for f in (tmp_path / "run" / "results" / "down").glob("*.json")}
    assert "endpoint:" in stdout and any(m.splitlines()[0][:200] in stdout for m in messages), stdout
    # Recorded in the data directory's store: the run, and its 20 attempts as rollouts linked to it.
    from harness_env.server.store import Store, default_data_dir, store_url
    from harness_env.server.store import eval_runs as er

    store = Store.open(store_url(default_data_dir()))
    try:
        run = er.get_run(store, json.loads((tmp_path / "run" / "eval.json").read_text())["run_key"])
        assert (run["status"], run["harness"], run["model"], run["base_url"], run["attempts"]) == ("finished", "whitebox", "m", policy.base_url, 4)
        assert run["tasks"] == [t["task_id"] for t in TASKS] and er.stored_summary(store, run["id"]) == summary
        assert len(er.run_attempts(store, run["id"])) == 20
    finally:
        store.close()
    assert len(list((tmp_path / "run" / "results").glob("*/*.json"))) == 20

    for fmt in ("jsonl", "parquet"):
        e = subprocess.run([*CLI, "export", str(tmp_path / "run"), "--format", fmt, "--to", str(tmp_path / fmt)], capture_output=True, text=True, timeout=120)
        assert e.returncode == 0, e.stderr
    import datasets

    for fmt in ("jsonl", "parquet"):
        kind = "json" if fmt == "jsonl" else "parquet"
        results = datasets.load_dataset(kind, data_files=str(tmp_path / fmt / f"results.{fmt}"), split="train")
        rows = datasets.load_dataset(kind, data_files=str(tmp_path / fmt / f"rows.{fmt}"), split="train")
        assert len(results) == 20 and sorted(Counter(results["task_id"]).values()) == [4, 4, 4, 4, 4]
        assert sum(results["passed"]) == 6
        assert len(rows) >= 16 and all(len(r["completion_ids"]) == len(r["loss_mask"]) == len(r["logprobs"]) for r in rows)
        assert all(r["trainable"] and r["prompt_ids"] and sum(r["loss_mask"]) > 0 for r in rows if r["task_id"] != "down")
    # Each attempt's token sidecar rebuilds its rows exactly (evals/sidecar.py), read back as written.
    from harness_env.evals.sidecar import rows_from_export

    lines = {t: [json.loads(x) for x in (tmp_path / "jsonl" / f"{t}.jsonl").read_text().splitlines()] for t in ("results", "rows")}
    assert [r for rec in lines["results"] for r in rows_from_export(rec)] == lines["rows"] and len(lines["rows"]) >= 16
    # The dataset card's configs name both tables: the directory loads by config name.
    card = (tmp_path / "parquet" / "README.md").read_text()
    assert "config_name: rows" in card and "whitebox" in card and "`half`" in card
    loaded = datasets.load_dataset(str(tmp_path / "parquet"), "rows", split="train")
    assert len(loaded) == len(rows)
    # Every attempt has an ATIF trajectory that Harbor's own model accepts, token fields alongside.
    from harbor.models.trajectories import Trajectory

    traj = Trajectory.model_validate(json.loads(results[0]["trajectory"]))
    agent_steps = [s for s in traj.steps if s.source == "agent"]
    assert agent_steps and agent_steps[0].metrics.completion_token_ids and agent_steps[0].metrics.logprobs


def test_eval_resumes_after_a_kill_without_rerunning_finished_attempts(tmp_path, policy):
    tasks = _write_jsonl(tmp_path / "tasks.jsonl", [_task("slow", ["test -f out.txt"]), _task("never", ["test -f out.txt"])])
    out = tmp_path / "run"
    killed_sandboxes = tmp_path / "killed-sandboxes"  # a SIGKILL leaves the rollout in flight behind: not the test's sandbox dir
    killed_sandboxes.mkdir()
    p = _eval(policy, tasks, out, "-n", "4", "--concurrency", "1", env={**os.environ, "HARNESS_ENV_SANDBOX_DIR": str(killed_sandboxes)})
    deadline = time.monotonic() + 120

    def in_flight() -> list[str]:
        return [n for n in os.listdir(killed_sandboxes) if not n.endswith(".lease")]

    while (len(list(out.glob("results/*/*.json"))) < 3 or not in_flight()) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    before = {f.relative_to(out): f.read_bytes() for f in out.glob("results/*/*.json")}
    assert 3 <= len(before) < 8, "the run was not killed halfway"
    started_before = sum(policy.policy.started.values())
    left = set(in_flight())
    assert left, "the kill left no rollout in flight behind"

    # The next eval on the same directory sweeps what the killed one left, first thing.
    again = _eval(policy, tasks, out, "-n", "4", "--concurrency", "2", env={**os.environ, "HARNESS_ENV_SANDBOX_DIR": str(killed_sandboxes)})
    stdout, stderr = again.communicate(timeout=240)
    assert again.returncode == 0, stderr
    assert all(f"removed rollout {name} of a dead owner" in stderr for name in left), stderr[-2000:]
    assert os.listdir(killed_sandboxes) == [] and mounts_at_or_below(killed_sandboxes.resolve()) == []
    after = {f.relative_to(out): f.read_bytes() for f in out.glob("results/*/*.json")}
    assert len(after) == 8 and all(after[k] == v for k, v in before.items())  # finished attempts kept as they were
    assert sum(policy.policy.started.values()) - started_before == 8 - len(before)  # only the missing ones ran
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"]["slow"]["pass_at_k"]["1"] == 1.0 and summary["tasks"]["never"]["mean_reward"] == 0.0
    assert not list(out.glob("results/*/.*.tmp"))
    other = subprocess.run(
        [*CLI, "eval", str(tasks), "--harness", "whitebox", "--base-url", policy.base_url, "--model", "other", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert other.returncode == 2 and "holds an evaluation of harness 'whitebox' with model 'm'" in other.stderr


def test_eval_over_two_servers_spreads_the_attempts(tmp_path, policy, start_server):
    from harness_env.client.http import HarnessEnv

    servers = [start_server(), start_server()]
    tasks = _write_jsonl(tmp_path / "tasks.jsonl", [TASKS[0], TASKS[1]])
    p = _eval(policy, tasks, tmp_path / "run", "-n", "2", "--concurrency", "4", "--server", servers[0].url, "--server", servers[1].url)
    _, stderr = p.communicate(timeout=240)
    assert p.returncode == 0, stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["overall"]["pass_at_k"] == {"1": 0.5, "2": 0.5} and summary["overall"]["infra_failures"] == 0
    ran = []
    for s in servers:
        with HarnessEnv(s.url) as env:
            ran.append(len(env.list_rollouts()["items"]))
        s.assert_no_rollout_left()
    assert sorted(ran) == [2, 2], ran  # 4 at once: the fewest in flight takes the next, 2 each


def test_eval_bad_server_url_is_one_line(tmp_path, policy):
    tasks = _write_jsonl(tmp_path / "tasks.jsonl", [TASKS[0]])
    p = _eval(policy, tasks, tmp_path / "run", "--server", "http://127.0.0.1:1", "--server", "ftp://nowhere")
    _, stderr = p.communicate(timeout=60)
    assert p.returncode == 2 and len(stderr.strip().splitlines()) == 1 and "ftp://nowhere" in stderr, stderr


def test_eval_of_task_ids_the_file_system_cannot_name_runs_and_exports(tmp_path, policy):
    """A 256-character id (the model allows it) crashed eval with 'File name too long'; ids with
    separators or dots must not escape results/ either."""
    long_id, other = "t" * 256, "../../" + "é" * 200
    tasks = _write_jsonl(tmp_path / "tasks.jsonl", [_task(long_id, ["true"]), _task(other, ["true"])])
    p = _eval(policy, tasks, tmp_path / "run", "-n", "2")
    stdout, stderr = p.communicate(timeout=240)
    assert p.returncode == 0 and "Traceback" not in stderr, stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [t["scored"] for t in summary["tasks"].values()] == [2, 2] and summary["overall"]["mean_reward"] == 1.0
    dirs = sorted(d.name for d in (tmp_path / "run" / "results").iterdir())
    assert len(dirs) == 2 and all(len(d) <= 100 and "/" not in d for d in dirs), dirs
    assert sorted(p.parent.name for p in (tmp_path / "run" / "results").glob("*/*.json")) == sorted(dirs * 2)
    assert {p.name for p in tmp_path.iterdir()} == {"tasks.jsonl", "run"}  # nothing written outside the run
    e = subprocess.run([*CLI, "export", str(tmp_path / "run"), "--format", "jsonl", "--to", str(tmp_path / "ds")], capture_output=True, text=True, timeout=120)
    assert e.returncode == 0, e.stderr
    rows = [json.loads(line) for line in (tmp_path / "ds" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in rows) == sorted(dirs * 2)
    # The same ids, run again: every attempt is found and none is rerun.
    started = sum(policy.policy.started.values())
    again = _eval(policy, tasks, tmp_path / "run", "-n", "2")
    _, stderr = again.communicate(timeout=240)
    assert again.returncode == 0 and sum(policy.policy.started.values()) == started == 4, stderr


def test_eval_bad_input_is_one_line(tmp_path, policy):
    p = _eval(policy, tmp_path / "missing.jsonl", tmp_path / "run")
    _, stderr = p.communicate(timeout=60)
    assert p.returncode == 2 and len(stderr.strip().splitlines()) == 1 and "no such file" in stderr


def test_eval_on_a_server_runs_each_attempt_as_a_job_once(tmp_path, policy, start_server):
    server = start_server()
    tasks = _write_jsonl(tmp_path / "tasks.jsonl", [TASKS[0], TASKS[1]])
    p = _eval(policy, tasks, tmp_path / "run", "-n", "2", "--concurrency", "2", "--server", server.url)
    stdout, stderr = p.communicate(timeout=240)
    assert p.returncode == 0, stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["overall"]["pass_at_k"] == {"1": 0.5, "2": 0.5} and summary["overall"]["infra_failures"] == 0
    assert policy.policy.started == {"always": 2, "never": 2}
    again = _eval(policy, tasks, tmp_path / "run", "-n", "2", "--server", server.url)  # all finished: nothing runs
    stdout, stderr = again.communicate(timeout=120)
    assert stdout and again.returncode == 0
    assert f"nothing to run: all 4 attempts in {tmp_path / 'run'} are finished" in stderr and "done," not in stderr, stderr
    assert policy.policy.started == {"always": 2, "never": 2}
    server.assert_no_rollout_left()
    # The run is recorded in this process's data directory, its attempts under the server's job ids.
    from harness_env.client.http import HarnessEnv
    from harness_env.server.store import Store, default_data_dir, store_url
    from harness_env.server.store import eval_runs as er

    with HarnessEnv(server.url) as env:
        jobs = {i["rollout_id"] for i in env.list_rollouts()["items"]}
    store = Store.open(store_url(default_data_dir()))
    try:
        run = er.list_runs(store)[0]
        assert run["servers"] == [server.url] and {a["id"] for a in er.run_attempts(store, run["id"])} == jobs
    finally:
        store.close()


def test_eval_exits_1_when_every_attempt_failed_for_infrastructure_reasons(tmp_path, policy):
    tasks = _write_jsonl(tmp_path / "tasks.jsonl", [TASKS[4]])  # the endpoint answers 500
    p = _eval(policy, tasks, tmp_path / "run", "-n", "2")
    stdout, stderr = p.communicate(timeout=240)
    assert p.returncode == 1, stderr
    assert "every attempt failed for infrastructure reasons" in stderr and "infrastructure failures: 2 of 2 attempts" in stdout
    assert "Traceback" not in stderr


def test_eval_on_a_terminal_redraws_one_progress_line(tmp_path, policy):
    import pty

    tasks = _write_jsonl(tmp_path / "tasks.jsonl", [TASKS[0]])
    master, slave = pty.openpty()
    p = subprocess.Popen(
        [*CLI, "eval", str(tasks), "--harness", "whitebox", "--base-url", policy.base_url, "--model", "m", "--out", str(tmp_path / "run"), "-n", "2"],
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
    )
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the terminal closed: the process exited
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    p.communicate(timeout=240)
    assert p.returncode == 0
    text = shown.decode()
    redraws = re.findall(r"\r(\d+)/2 done", text)  # a carriage return that starts a line again, not a newline's
    assert len(redraws) >= 2 and redraws[-1] == "2" and "[eval]" not in text and "\x1b[K" in text, text
    assert "\r2/2 done, 0 running, 0 failed" in text and "mean reward 1.000" in text


def test_eval_stopped_by_ctrl_c_is_recorded_stopped_and_a_resume_finishes_it(tmp_path, policy):
    from harness_env.server.store import Store, default_data_dir, store_url
    from harness_env.server.store import eval_runs as er

    tasks = _write_jsonl(tmp_path / "tasks.jsonl", [_task("slow", ["test -f out.txt"])])
    out = tmp_path / "run"
    p = _eval(policy, tasks, out, "-n", "4", "--concurrency", "1")
    deadline = time.monotonic() + 120
    while not list(out.glob("results/*/*.json")) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, stderr = p.communicate(timeout=120)
    assert p.returncode == 130 and "stopped by SIGINT" in stderr, stderr
    key = json.loads((out / "eval.json").read_text())["run_key"]
    store = Store.open(store_url(default_data_dir()))
    try:
        assert er.get_run(store, key)["status"] == "stopped"
        assert er.stored_summary(store, key)["overall"]["attempts"] == len(list(out.glob("results/*/*.json"))) < 4
        again = _eval(policy, tasks, out, "-n", "4")
        again.communicate(timeout=240)
        assert again.returncode == 0
        assert er.get_run(store, key)["status"] == "finished" and len(er.run_attempts(store, key)) == 4
        assert len(er.list_runs(store)) == 1  # the resumed run is the same run
    finally:
        store.close()
