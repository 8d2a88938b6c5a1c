"""/metrics and the rollout log line on a real `harness-env serve`: a passing and a failing rollout
counted by status and error kind, their phases and model calls (as many as the results' captured
turns), the admission and store gauges; behind the token like the rest; one log line per rollout
end, secrets masked."""

from __future__ import annotations

import shlex

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.policy import hello_rollout


def scrape(url: str, headers: dict | None = None) -> dict[str, list]:
    """Samples by name, as Prometheus would read them."""
    r = httpx.get(url + "/metrics", headers=headers, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    return samples


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    return sum(s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def rollout_lines(log: str) -> list[dict[str, str]]:
    out = []
    for line in log.splitlines():
        if " harness_env.rollouts: rollout_end " in line:
            out.append(dict(part.split("=", 1) for part in shlex.split(line.split(" rollout_end ", 1)[1])))
    return out


@pytest.mark.e2e
def test_metrics_count_rollouts_phases_model_calls_and_read_the_levels(start_server, policy_server) -> None:
    server = start_server(env={"HARNESS_ENV_LOG_LEVEL": "info"})
    before = scrape(server.url)
    assert value(before, "harness_env_rollouts_running") == 0 and value(before, "harness_env_rollouts_queued") == 0
    assert value(before, "harness_env_rollouts_max_concurrent") >= 1 and "harness_env_rollouts_total" not in before

    passed = httpx.post(server.url + "/rollout", json=hello_rollout(policy_server, "metrics-pass", task_id="pass task"), timeout=300).json()
    assert passed["reward"] == 1.0 and passed["error"] is None
    failed = httpx.post(server.url + "/rollout", json=hello_rollout(policy_server, "metrics-fail", task_id="fail-task", setup=["exit 3"]), timeout=300).json()
    assert failed["error_kind"] == "setup" and failed["reward"] is None

    m = scrape(server.url)
    assert value(m, "harness_env_rollouts_total") == 2
    assert value(m, "harness_env_rollouts_total", status="finished", error_kind="none", harness="whitebox") == 1
    assert value(m, "harness_env_rollouts_total", status="failed", error_kind="setup", harness="whitebox") == 1
    assert value(m, "harness_env_rollout_wall_seconds_count") == 2
    # The masked share: the setup failure never trains (its reward is lost to infrastructure).
    assert failed["mask_sample"] is True and failed["failure_kind"] == "setup" and passed["mask_sample"] is False
    assert value(m, "harness_env_rollouts_masked_total") == 1
    assert value(m, "harness_env_rollouts_masked_total", failure_kind="setup", harness="whitebox") == 1
    for phase in ("endpoint", "sandbox", "setup", "agent", "verify", "collect"):
        assert value(m, "harness_env_phase_duration_seconds_count", phase=phase) >= 1, phase
    assert value(m, "harness_env_phase_duration_seconds_sum", phase="agent") > 0
    assert value(m, "harness_env_phase_duration_seconds_count", phase="agent") == 1  # the failed one never started its agent

    turns = [t for r in (passed, failed) for t in r["proxy_turns"]]
    assert len(turns) >= 2
    assert value(m, "harness_env_model_calls_total") == len(turns)
    assert value(m, "harness_env_model_calls_total", purpose="policy", outcome="answered") == len(turns)
    assert value(m, "harness_env_model_call_latency_seconds_count") == len(turns)
    assert value(m, "harness_env_model_call_latency_seconds_sum") > 0
    assert value(m, "harness_env_model_completion_tokens_total") == sum(len(t["completion_token_ids"]) for t in turns)

    assert value(m, "harness_env_rollouts_running") == 0 and value(m, "harness_env_rollouts_queued") == 0
    assert value(m, "harness_env_store_rollouts", status="finished") == 1 and value(m, "harness_env_store_rollouts", status="failed") == 1
    assert value(m, "harness_env_store_result_bytes") > 0 and value(m, "harness_env_store_file_bytes") > 0

    open_metrics = httpx.get(server.url + "/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text") and open_metrics.text.endswith("# EOF\n")

    log = server.log_path.read_text()  # each line is flushed as it is written
    lines = rollout_lines(log)
    assert len(lines) == 2, log[-3000:]
    by_task = {line["task"]: line for line in lines}
    assert by_task["pass task"] == {
        "id": passed["rollout_id"],
        "task": "pass task",
        "harness": "whitebox",
        "status": "finished",
        "reward": "1.0",
        "error_kind": "none",
        "mask_sample": "False",
        "wall_s": by_task["pass task"]["wall_s"],
    }
    assert by_task["fail-task"] == {
        "id": failed["rollout_id"],
        "task": "fail-task",
        "harness": "whitebox",
        "status": "failed",
        "reward": "none",
        "error_kind": "setup",
        "mask_sample": "True",
        "wall_s": by_task["fail-task"]["wall_s"],
    }
    assert abs(float(by_task["pass task"]["wall_s"]) - passed["wall_s"]) < 0.01 and float(by_task["fail-task"]["wall_s"]) > 0


@pytest.mark.e2e
def test_metrics_want_the_token_and_the_log_line_masks_secrets(start_server, policy_server) -> None:
    token = "metrics-token-0123456789abcdef"
    server = start_server("--token", token, env={"HARNESS_ENV_LOG_LEVEL": "info"})
    assert httpx.get(server.url + "/metrics").status_code == 401
    assert httpx.get(server.url + "/metrics", headers={"authorization": "Bearer wrong-token-0123456789"}).status_code == 401
    auth = {"authorization": f"Bearer {token}"}
    result = httpx.post(server.url + "/rollout", json=hello_rollout(policy_server, "metrics-secret", task_id=f"task {token}"), headers=auth, timeout=300).json()
    assert result["reward"] == 1.0
    assert value(scrape(server.url, auth), "harness_env_rollouts_total", status="finished") == 1
    log = server.log_path.read_text()  # each line is flushed as it is written
    lines = rollout_lines(log)
    assert len(lines) == 1 and lines[0]["id"] == result["rollout_id"] and lines[0]["task"] == "task [redacted]"
    assert token not in log


def test_each_app_counts_alone_and_the_line_quotes_and_masks() -> None:
    """Two apps in one process: a rollout counted by one is not in the other's /metrics."""
    from types import SimpleNamespace

    from harness_env.core.capture.redact import register_secret, unregister_secret
    from harness_env.models import RolloutResult
    from harness_env.server.metrics import ServerMetrics, rollout_line
    from harness_env.server.slots import RolloutSlots

    slots = RolloutSlots(4, 16, 3)
    slots.running, slots.queued = 1, 2
    first, second = (ServerMetrics(slots, SimpleNamespace(store=None)) for _ in range(2))  # type: ignore[arg-type]
    first.rollout_ended("r1", "cancelled", RolloutResult(harness="pi", error="cancelled", error_kind="internal", wall_s=1.5))
    one, two = (text_string_to_metric_families(m.render(None)[0].decode()) for m in (first, second))
    one = {s.name: s for f in one for s in f.samples}
    two = {s.name: s for f in two for s in f.samples}
    assert one["harness_env_rollouts_total"].labels == {"status": "cancelled", "error_kind": "internal", "harness": "pi"}
    assert one["harness_env_rollouts_masked_total"].labels == {"failure_kind": "internal", "harness": "pi"}
    assert "harness_env_rollouts_total" not in two and two["harness_env_rollouts_queued"].value == 2
    assert two["harness_env_rollouts_max_starting"].value == 3 and two["harness_env_rollouts_starting"].value == 0
    secret = "sk-metrics-unit-secret-42"
    register_secret(secret)
    try:
        line = rollout_line("r2", "finished", RolloutResult(task_id=f'a "b"={secret}', harness="pi", reward=0.5, wall_s=2.0))
    finally:
        unregister_secret(secret)
    assert line == 'rollout_end id=r2 task="a \\"b\\"=[redacted]" harness=pi status=finished reward=0.5 error_kind=none mask_sample=False wall_s=2.0'
    assert dict(p.split("=", 1) for p in shlex.split(line)[1:])["task"] == 'a "b"=[redacted]'
