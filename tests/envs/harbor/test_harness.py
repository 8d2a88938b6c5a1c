"""harness="harbor" end to end: Harbor's own Trial (its agents, its verifier) in our bubblewrap
environment, through the engine and the capture proxy, against the scripted fake policy."""

import json
import os
import shutil
from pathlib import Path

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.core import toolchain
from harness_env.core.errors import InvalidRequestError
from harness_env.envs.harbor.options import HarborOptions
from harness_env.envs.harbor.resolve import list_tasks, prepare
from harness_env.envs.harbor.task_dir import task_to_task_dir
from tests import needs
from tests.core.sandbox.test_images import _build_image, _cache_entries, push, registry_host  # noqa: F401 - the loopback registry

needs.module("harbor.trial.trial", "uv sync --extra harbor")
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("needs_bwrap")]

UPSTREAM_KEY = "sk-upstream-harbor-5c4b3a"
# Harbor's hello-world shape, written by hand (not by our converter): Dockerfile, test.sh, solve.sh.
HELLO_WORLD = Path(__file__).parent / "fixtures" / "hello-world"
HELLO = Task(instruction="Write the word hello into /app/hello.txt.", verify=["grep -qx hello /app/hello.txt"])


def hello_task_dir(root, name="hello-world", *, solve=True, test_sh=None):
    """Harbor's hello-world shape: the agent writes a file, tests/test.sh checks it."""
    out = task_to_task_dir(HELLO, root / name, agent_timeout_s=120, verify_timeout_s=60)
    if test_sh is not None:
        (out / "tests" / "test.sh").write_text(test_sh)
    if solve:  # Harbor's oracle runs solution/solve.sh
        (out / "solution").mkdir()
        (out / "solution" / "solve.sh").write_text("#!/usr/bin/env bash\necho hello > /app/hello.txt\n")
    return out


def harbor_request(srv, harbor, *, task=None, script=None, **kw):
    srv.policy.scripts["policy-m"] = script or []
    endpoint = Endpoint(base_url=srv.base_url, api_key=UPSTREAM_KEY, model="policy-m")
    kw.setdefault("agent_timeout_s", 120)
    fields = dict(harness="harbor", harbor=HarborOptions(**harbor), endpoint=endpoint, **kw)
    if task is not None:
        fields["task"] = task
    return RolloutRequest(**fields)


def _no_process_left(marker: str) -> None:
    """No process whose environment names `marker` (a sandbox id, or the sandboxes root)."""
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                env = open(f"/proc/{pid}/environ", "rb").read()
            except OSError:
                continue
            assert marker.encode() not in env, f"process {pid} of {marker} is still running"


async def test_oracle_passes_and_nop_fails(policy_server):
    ok = await run_rollout(harbor_request(policy_server, {"task_dir": str(HELLO_WORLD), "agent": "oracle"}))
    assert ok.error is None, ok.error
    assert ok.reward == 1.0 and ok.reward_source == "reward_file"
    assert ok.task_id == "hello-world" and ok.run_info.task_name == "hello-world" and ok.run_info.agent == "oracle"
    assert ok.files == {"hello.txt": "Hello, world!\n"}
    assert [p.name for p in ok.phases] == ["endpoint", "sandbox", "setup", "agent", "verify", "collect"]
    assert ok.proxy_turns == []  # the oracle calls no model
    _no_process_left(ok.sandbox_id)

    nop = await run_rollout(harbor_request(policy_server, {"task_dir": str(HELLO_WORLD), "agent": "nop"}))
    assert nop.error is None, nop.error
    assert nop.reward == 0.0
    assert nop.files == {}


@pytest.mark.parametrize("agent", ["pi", "opencode"])
async def test_harbor_agents_through_the_capture_proxy(policy_server, tmp_path, agent, monkeypatch):
    # A key in the server's environment must not reach the agent: Harbor's agents read os.environ.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-server-env-secret-77")
    script = [{"bash": "echo 'Hello, world!' > /app/hello.txt && env > /app/env.txt"}, {"text": "Wrote it."}]
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(HELLO_WORLD), "agent": agent}, script=script, top_logprobs=1))
    assert res.error is None, (res.error, res.agent_log_tail)
    assert res.reward == 1.0
    policy = [t for t in res.proxy_turns if t.purpose == "policy"]
    assert len(policy) == 2
    for t in policy:
        assert t.prompt_token_ids and t.completion_token_ids
        assert len(t.per_token_logps) == len(t.completion_token_ids)
        assert t.capture_level == "tokens"
    assert policy[0].tool_calls[0]["function"]["name"] == "bash"
    assert res.rollout_type == "train"
    rows = [r for r in res.training_rows() if r.trainable]
    assert rows and all(r.reward == 1.0 for r in rows)
    # Harbor's ATIF trajectory and the tool-call count from it
    assert res.agent_trajectory is not None and res.agent_trajectory["schema_version"].startswith("ATIF")
    assert res.agent_tool_calls == 1
    assert res.agent_final_text == "Wrote it."
    assert res.run_info.agent == agent and res.run_info.agent_version == toolchain.pin_of(agent).version  # the pinned CLI ran
    # The agent presented the per-rollout capture key; the upstream key stayed in the proxy.
    auths = {h.get("authorization") for h in policy_server.policy.headers[2:]}
    assert auths == {f"Bearer {UPSTREAM_KEY}"}, auths  # proxy -> fake: the real key, added by the proxy
    env_dump = res.files["env.txt"]
    assert UPSTREAM_KEY not in env_dump and "sk-server-env-secret-77" not in env_dump
    assert "HARNESS_ENV_CAPTURE_KEY=" in env_dump
    assert UPSTREAM_KEY not in res.model_dump_json()
    _no_process_left(res.sandbox_id)


# Harbor's agents of the CLIs that speak a vendor's API: the proxy serves their dialect. Their shell
# tool as each names it (Harbor runs Codex with unified_exec),
# the tool, and the variable the capture key reaches the CLI in, and where its native config lies.
VENDOR_AGENTS = {
    "codex": ("exec_command", "HARNESS_ENV_API_KEY", "$CODEX_HOME/config.toml"),
    "claude-code": ("Bash", "ANTHROPIC_AUTH_TOKEN", "/tmp/claude-code-settings/settings.json"),
    "gemini-cli": ("run_shell_command", "GEMINI_API_KEY", "$HOME/.gemini/settings.json"),
}
# What the native config must say for the CLI to reach the proxy exactly and stay offline.
NATIVE_CONFIG_SAYS = {
    "codex": ['wire_api = "responses"', "supports_websockets = false", 'model_provider = "harness-env"'],
    "claude-code": ['"WebFetch"'],
    "gemini-cli": ['"gemini-api-key"', '"usageStatisticsEnabled": false', '"google_web_search"'],
}


@pytest.mark.parametrize("agent", sorted(VENDOR_AGENTS))
async def test_harbor_vendor_api_agents_through_the_capture_proxy(policy_server, agent, monkeypatch):
    from harness_env.envs.harbor.agents import OFFLINE_ENV

    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.setenv(name, "sk-server-env-secret-77")  # the server's own keys never reach the agent
    shell_tool, key_env, config_path = VENDOR_AGENTS[agent]
    script = [{"bash": f"echo 'Hello, world!' > /app/hello.txt && env > /app/env.txt && cat {config_path} > /app/config.txt"}, {"text": "Wrote it."}]
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(HELLO_WORLD), "agent": agent}, script=script, top_logprobs=1))
    assert res.error is None, (res.error, res.agent_log_tail)
    assert res.reward == 1.0
    # Captured token ids are exactly the engine's (the scripted policy's), turn by turn.
    sent = [s for s in policy_server.policy.sent if s.request.get("tools")]
    policy = [t for t in res.proxy_turns if t.purpose == "policy"]
    assert len(policy) == len(sent) == 2, [t.purpose for t in res.proxy_turns]
    for turn, s in zip(policy, sent):
        assert turn.prompt_token_ids == s.prompt_token_ids and turn.prompt_token_ids
        assert turn.completion_token_ids == s.completion_token_ids and turn.completion_token_ids
        assert turn.per_token_logps == s.logprobs
        assert turn.capture_level == "tokens" and turn.stream  # streamed through the dialect
    assert policy[0].tool_calls[0]["function"]["name"] == shell_tool
    rows = [r for r in res.training_rows() if r.trainable]
    assert len(rows) == res.graph.branches == 1 and rows[0].reward == 1.0  # one thread: the dialect replays history exactly
    assert res.run_info.agent == agent and res.run_info.agent_version == toolchain.pin_of(agent).version  # the pinned CLI ran
    # Harbor's ATIF trajectory and the tool-call count from it
    assert res.agent_trajectory is not None and res.agent_tool_calls == 1 and res.agent_final_text == "Wrote it."
    # The CLI presented the per-rollout capture key; the upstream key stayed in the proxy.
    env_dump = res.files["env.txt"]
    assert f"{key_env}=" in env_dump
    assert all(f"{k}={v}" in env_dump for k, v in OFFLINE_ENV[agent].items())  # our offline table reached the CLI
    assert all(said in res.files["config.txt"] for said in NATIVE_CONFIG_SAYS[agent]), res.files["config.txt"]
    assert UPSTREAM_KEY not in env_dump and "sk-server-env-secret-77" not in env_dump
    assert UPSTREAM_KEY not in res.model_dump_json()
    _no_process_left(res.sandbox_id)


async def test_harbor_claude_code_against_an_upstream_that_speaks_messages(policy_server):
    """Pass-through under Harbor (black_box): the agent's calls go to a native Messages upstream
    untranslated, with the real key in x-api-key, and are still recorded."""
    from tests.fakes.messages_upstream import FakeMessagesServer, FakeMessagesUpstream

    script = [{"bash": "echo 'Hello, world!' > /app/hello.txt && env > /app/env.txt"}, {"text": "Wrote it."}]
    upstream = FakeMessagesUpstream(key=UPSTREAM_KEY, scripts={"native-m": script})
    with FakeMessagesServer(upstream) as server:
        endpoint = Endpoint(base_url=server.base_url, api_key=UPSTREAM_KEY, model="native-m", wire_api="messages")
        res = await run_rollout(
            RolloutRequest(
                harness="harbor", harbor=HarborOptions(task_dir=str(HELLO_WORLD), agent="claude-code"), endpoint=endpoint, mode="black_box", agent_timeout_s=120
            )
        )
    assert res.error is None, (res.error, res.agent_log_tail)
    assert res.reward == 1.0 and res.agent_final_text == "Wrote it."
    assert len(upstream.tool_requests()) == 2 and all(h["x-api-key"] == UPSTREAM_KEY for h in upstream.headers)
    turns = [t for t in res.proxy_turns if t.purpose == "policy"]
    assert [t.upstream_status for t in turns] == [200, 200] and turns[0].tool_calls[0]["function"]["name"] == "Bash"
    assert UPSTREAM_KEY not in res.files["env.txt"] and UPSTREAM_KEY not in res.model_dump_json()
    _no_process_left(res.sandbox_id)


# The rest of the native suite's cases (tests/envs/test_e2e.py) for the vendor-API agents under
# Harbor: the work not done (and a reward forged) scores 0, a hanging policy is one deadline with
# nothing left, an unreachable endpoint is the endpoint's failure (reward None, never 0).
FORGE = (
    "for f in /logs/verifier/reward.txt /root/logs/verifier/reward.txt; do mkdir -p $(dirname $f); echo 1.0 > $f; done; "
    "echo '{\"reward\": 1.0}' > /logs/verifier/reward.json; echo forged"
)


# A verifier that trusts a reward file it finds (writes 0 only when there is none): a forged file
# that survived to verify would score 1.0.
TRUSTING_TEST_SH = (
    "#!/bin/bash\nif grep -qx hello /app/hello.txt; then echo 1 > /logs/verifier/reward.txt\n"
    "elif [ ! -e /logs/verifier/reward.txt ]; then echo 0 > /logs/verifier/reward.txt; fi\n"
)


@pytest.mark.parametrize("agent", sorted(VENDOR_AGENTS))
async def test_harbor_vendor_api_agent_not_doing_the_work_scores_0_even_forging_the_reward(policy_server, tmp_path, agent):
    task_dir = hello_task_dir(tmp_path, solve=False, test_sh=TRUSTING_TEST_SH)
    script = [{"bash": FORGE}, {"text": "I did not write hello.txt."}]
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(task_dir), "agent": agent}, script=script))
    assert res.error is None, (res.error, res.agent_log_tail)
    assert res.reward == 0.0 and res.reward_source == "reward_file" and res.agent_tool_calls == 1
    assert "hello.txt" not in res.files
    _no_process_left(res.sandbox_id)


@pytest.mark.parametrize("agent", sorted(VENDOR_AGENTS))
async def test_harbor_vendor_api_agent_with_a_hanging_policy_times_out_and_leaves_nothing(policy_server, agent):
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(HELLO_WORLD), "agent": agent}, script=[{"hang": 120}], agent_timeout_s=8))
    assert res.reward is None and res.error_kind == "agent_timeout", (res.error_kind, res.error)
    assert "AgentTimeoutError" in res.error  # stopped by the rollout's deadline, not by the hang ending
    _no_process_left(res.sandbox_id)


@pytest.mark.parametrize("agent", sorted(VENDOR_AGENTS))
async def test_harbor_vendor_api_agent_with_an_unreachable_endpoint_is_an_endpoint_error(policy_server, agent):
    req = harbor_request(policy_server, {"task_dir": str(HELLO_WORLD), "agent": agent}, script=[{"text": "never asked"}])
    req.endpoint.base_url = "http://127.0.0.1:9/v1"
    res = await run_rollout(req)
    assert res.error_kind == "endpoint" and res.reward is None and "unreachable" in res.error
    assert policy_server.policy.requests == [] and res.proxy_turns == []


@pytest.mark.parametrize(
    "verify, expected",
    [
        (["grep -qx hello /app/hello.txt", "test -f /app/missing.txt"], 0.5),
        (['echo 0.25 > "$HARNESS_ENV_REWARD_FILE"', "false"], 0.25),
        # A hung verify command fails alone (verify_timeout_s is per command), the others still count.
        (["sleep 600", "grep -qx hello /app/hello.txt"], 0.5),
    ],
)
async def test_converted_task_gives_the_native_reward(policy_server, verify, expected):
    task = Task(instruction="Write hello into /app/hello.txt.", verify=verify, task_id="uniform")
    script = [{"bash": "echo hello > /app/hello.txt"}, {"text": "done"}]
    via_harbor = await run_rollout(harbor_request(policy_server, {"agent": "pi"}, task=task, script=script, verify_timeout_s=3))
    assert via_harbor.error is None, via_harbor.error
    # Natively the workspace is the cwd, not /app: the same task with relative paths.
    native_task = task.model_copy(update={"verify": [v.replace("/app/", "") for v in verify]})
    policy_server.policy.scripts["policy-m"] = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]
    native = await run_rollout(
        RolloutRequest(
            task=native_task, endpoint=Endpoint(base_url=policy_server.base_url, model="policy-m"), harness="pi", agent_timeout_s=120, verify_timeout_s=3
        )
    )
    assert native.error is None, native.error
    assert via_harbor.reward == native.reward == expected
    assert [r.exit_code == 0 for r in via_harbor.verify_results] == [r.exit_code == 0 for r in native.verify_results]
    assert [(r.timed_out, r.exit_code) for r in via_harbor.verify_results if r.timed_out] == [
        (r.timed_out, r.exit_code) for r in native.verify_results if r.timed_out
    ]
    assert [r.cmd for r in via_harbor.verify_results] == verify
    assert via_harbor.task_id == "uniform" and via_harbor.run_info.task_path == ""


def _reward_json_task(tmp_path, rewards: dict, name: str):
    test_sh = f"#!/usr/bin/env bash\nmkdir -p /logs/verifier\necho '{json.dumps(rewards)}' > /logs/verifier/reward.json\n"
    return hello_task_dir(tmp_path, name, test_sh=test_sh)


async def test_reward_json_map_and_reward_key(policy_server, tmp_path):
    task_dir = _reward_json_task(tmp_path, {"accuracy": 0.25, "reward": 0.75}, "two-keys")
    default = await run_rollout(harbor_request(policy_server, {"task_dir": str(task_dir), "agent": "oracle"}))
    assert default.error is None and default.reward == 0.75
    assert default.run_info.verifier_rewards == {"accuracy": 0.25, "reward": 0.75}
    keyed = await run_rollout(harbor_request(policy_server, {"task_dir": str(task_dir), "agent": "oracle", "reward_key": "accuracy"}))
    assert keyed.error is None and keyed.reward == 0.25

    missing = await run_rollout(harbor_request(policy_server, {"task_dir": str(task_dir), "agent": "oracle", "reward_key": "f1"}))
    # The request's reward_key picks none of the verifier's rewards: the request's to fix, no reward.
    assert missing.reward is None and missing.error_kind == "invalid_request"
    assert "f1" in missing.error and "accuracy" in missing.error and "reward" in missing.error

    ambiguous_dir = _reward_json_task(tmp_path, {"a": 1, "b": 0}, "ambiguous")
    ambiguous = await run_rollout(harbor_request(policy_server, {"task_dir": str(ambiguous_dir), "agent": "oracle"}))
    assert ambiguous.reward is None and ambiguous.error_kind == "invalid_request"
    assert "['a', 'b']" in ambiguous.error and "reward_key" in ambiguous.error


async def test_missing_provider_credentials_fail_before_any_work(policy_server, tmp_path, monkeypatch):
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    task_dir = hello_task_dir(tmp_path)
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(task_dir), "agent": "pi", "sandbox": "e2b"}))
    assert res.reward is None and res.error_kind == "sandbox"
    assert "E2B_API_KEY" in res.error and "'e2b'" in res.error
    assert [p.name for p in res.phases] == ["endpoint", "collect"]  # no trial, no sandbox

    # With credentials, a remote sandbox still cannot reach a loopback proxy: said before starting.
    monkeypatch.setenv("E2B_API_KEY", "e2b-test-key")
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(task_dir), "agent": "pi", "sandbox": "e2b"}))
    assert res.error_kind == "sandbox" and "--public-url" in res.error
    assert "e2b-test-key" not in res.model_dump_json()


@pytest.mark.parametrize(
    ("agent", "said"), [("cursor-cli", "it takes no custom model endpoint"), ("terminus-1", "cannot be built here")]
)  # listed by Harbor, no class
async def test_agents_the_proxy_cannot_serve_are_refused_before_any_work(policy_server, tmp_path, monkeypatch, agent, said):
    monkeypatch.delenv("E2B_API_KEY", raising=False)  # the agent is said first: no credential hunt for a rollout that cannot run
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(hello_task_dir(tmp_path)), "agent": agent, "sandbox": "e2b"}))
    assert res.reward is None and res.error_kind == "invalid_request", res.error
    assert said in res.error and f"{agent!r}" in res.error
    if agent == "cursor-cli":  # what the proxy serves, and what to choose instead
        assert "anthropic_messages" in res.error and "codex" in res.error
    assert [p.name for p in res.phases] == ["endpoint", "collect"]  # no trial, no sandbox


@pytest.mark.parametrize("agent", sorted(VENDOR_AGENTS))
async def test_vendor_api_agents_pass_the_agent_check_on_a_provider_sandbox(policy_server, tmp_path, monkeypatch, agent):
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(hello_task_dir(tmp_path)), "agent": agent, "sandbox": "e2b"}))
    assert res.error_kind == "sandbox" and "E2B_API_KEY" in res.error, res.error  # past the agent check: the provider's credentials are next


async def test_agent_timeout_is_one_deadline(policy_server, tmp_path):
    task_dir = hello_task_dir(tmp_path, solve=False)
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(task_dir), "agent": "pi"}, script=[{"hang": 120}], agent_timeout_s=8))
    assert res.reward is None and res.error_kind == "agent_timeout", (res.error, res.run_info)
    assert "AgentTimeoutError" in res.error
    _no_process_left(res.sandbox_id)


def test_prepare_reads_the_task_and_checks_names(tmp_path):
    dataset = tmp_path / "dataset" / "train"
    for name in ("b-task", "a-task"):
        hello_task_dir(dataset, name)
    endpoint = Endpoint(base_url="http://127.0.0.1:9", model="m")
    req = RolloutRequest(harness="harbor", harbor={"dataset": str(tmp_path / "dataset"), "split": "train", "task_index": 1}, endpoint=endpoint)
    ready = prepare(req, trusted=True)
    assert ready.harness_options.task_dir == str((dataset / "b-task").resolve())  # sorted, as Harbor lists them
    assert ready.task.instruction == HELLO.instruction and ready.task.task_id == "b-task"
    assert [t.name for t in list_tasks(str(tmp_path / "dataset"), "train", trusted=True)] == ["a-task", "b-task"]

    with pytest.raises(InvalidRequestError, match="out of range"):
        prepare(req.model_copy(update={"harness_options": req.harness_options.model_copy(update={"task_index": 5})}), trusted=True)
    with pytest.raises(InvalidRequestError, match="cannot run in the local sandbox"):
        prepare(req.model_copy(update={"harness_options": HarborOptions(task_dir=str(dataset / "a-task"), agent="aider")}), trusted=True)
    with pytest.raises(InvalidRequestError, match="runs the pinned pi"):
        prepare(req.model_copy(update={"harness_options": HarborOptions(task_dir=str(dataset / "a-task"), agent_kwargs={"version": "0.1.0"})}), trusted=True)
    with pytest.raises(InvalidRequestError, match="unknown Harbor agent 'no-such-agent'"):
        prepare(req.model_copy(update={"harness_options": HarborOptions(task_dir=str(dataset / "a-task"), agent="no-such-agent")}), trusted=True)
    with pytest.raises(InvalidRequestError, match="HARNESS_ENV_HARBOR_TASKS_DIR"):
        prepare(req, trusted=False)  # a remote caller names paths only under the configured root


async def test_a_failing_endpoint_stops_the_trial(policy_server, tmp_path):
    task_dir = hello_task_dir(tmp_path, solve=False)
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(task_dir), "agent": "pi"}, script=[{"status": 503}]))
    assert res.reward is None and res.error_kind == "endpoint", (res.error, res.run_info)
    assert "503" in res.error and "the agent was stopped" in res.error  # stopped, not left to its own deadline
    _no_process_left(res.sandbox_id)


async def test_a_failing_setup_is_a_setup_error(policy_server):
    task = Task(instruction="Nothing to do.", setup=["echo preparing", "exit 3"], verify=["true"])
    res = await run_rollout(harbor_request(policy_server, {"agent": "nop"}, task=task))
    assert res.reward is None and res.error_kind == "setup", (res.error_kind, res.error)
    assert "setup.sh" in res.error and "exit code 3" in res.error


async def test_a_missing_agent_cli_is_said_before_any_work(policy_server, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_ENV_TOOLS_DIR", str(tmp_path / "empty-tools"))
    res = await run_rollout(harbor_request(policy_server, {"agent": "opencode"}, task=HELLO))
    assert res.reward is None and "harness-env install opencode" in res.error, res.error
    assert [p.name for p in res.phases] == ["endpoint", "collect"]


async def test_concurrent_harbor_rollouts_stay_apart(policy_server, tmp_path):
    from harness_env.rollout import run_many

    script = [{"bash": "echo hello > /app/hello.txt && ls /app > /app/seen.txt"}, {"text": "done"}]
    policy_server.policy.scripts["policy-m"] = script
    reqs = [harbor_request(policy_server, {"agent": "pi"}, task=HELLO.model_copy(update={"task_id": f"t{i}"}), script=script) for i in range(3)]
    results = await run_many(reqs, concurrency=3)
    assert [r.reward for r in results] == [1.0, 1.0, 1.0], [r.error for r in results]
    assert [r.task_id for r in results] == ["t0", "t1", "t2"]
    assert len({r.sandbox_id for r in results}) == 3
    for r in results:  # each saw only its own workdir
        assert r.files["seen.txt"].split() == ["hello.txt", "seen.txt"]
        assert len([t for t in r.proxy_turns if t.purpose == "policy"]) == 2


async def test_a_converted_task_without_verify_commands_has_no_reward_and_no_error(policy_server):
    # The native rule: no verify commands, no reward; not a failure.
    res = await run_rollout(harbor_request(policy_server, {"agent": "nop"}, task=Task(instruction="Look around.")))
    assert res.error is None, res.error
    assert res.reward is None and "no verify commands" in " ".join(res.reward_notes)


def _task_solved_by(tmp_path, name: str, solve_sh: str):
    out = hello_task_dir(tmp_path, name, solve=False)
    (out / "solution").mkdir()
    (out / "solution" / "solve.sh").write_text("#!/usr/bin/env bash\n" + solve_sh)
    return out


async def test_links_the_agent_plants_reach_no_host_file(policy_server, tmp_path, monkeypatch):
    # The oracle's solve.sh stands in for any agent's shell: links out of the sandbox, planted in
    # directories Harbor copies back (logs) and into (tests), must neither leak nor overwrite.
    monkeypatch.setenv("SERVER_CANARY", "canary-5e6f-server-env")
    secret = tmp_path / "host-secret.json"
    secret.write_text('{"steps": [{"source": "agent", "message": "host-secret-9a8b"}]}')
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    task_dir = _task_solved_by(
        tmp_path,
        "links",
        (
            "echo hello > /app/hello.txt\n"
            "ln -s /proc/self/environ /logs/agent/leak.txt\n"
            f"ln -s {secret} /logs/agent/trajectory.json\n"
            f"rm -f /tests/test.sh; ln -s {victim} /tests/test.sh\n"
            "mkdir -p /logs/verifier/reward.txt/blocked\n"
        ),
    )
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(task_dir), "agent": "oracle"}))
    dump = res.model_dump_json()
    assert "canary-5e6f-server-env" not in dump and "host-secret-9a8b" not in dump
    assert victim.read_text() == "untouched\n"
    # The verifier ran on fresh /tests and /logs/verifier: the sabotage changed nothing.
    assert res.error is None and res.reward == 1.0, (res.error, res.reward_notes)


async def test_a_blocked_verifier_dir_still_scores_zero(policy_server, tmp_path):
    task_dir = _task_solved_by(tmp_path, "blocker", "mkdir -p /logs/verifier/reward.txt/x /logs/verifier/reward.json/x\n")
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(task_dir), "agent": "oracle"}))
    assert res.error is None and res.reward == 0.0, (res.error_kind, res.error)


async def test_the_turn_limit_is_graded_not_failed(policy_server, tmp_path):
    script = [{"bash": "echo hello > /app/hello.txt"}, {"bash": "echo more"}, {"text": "done"}]
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(hello_task_dir(tmp_path, solve=False)), "agent": "pi"}, script=script, max_turns=1))
    assert res.turn_limit_hit
    assert res.error is None and res.reward == 1.0, (res.error_kind, res.error)


async def test_a_cancelled_harbor_rollout_leaves_nothing(policy_server, tmp_path):
    import asyncio

    task_dir = hello_task_dir(tmp_path, solve=False)
    req = harbor_request(policy_server, {"task_dir": str(task_dir), "agent": "pi"}, script=[{"hang": 120}])
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(run_rollout(req), 15)
    root = os.environ["HARNESS_ENV_SANDBOX_DIR"]
    for _ in range(120):  # the trial stops itself in its own task
        if not os.listdir(root):
            break
        await asyncio.sleep(0.5)
    assert os.listdir(root) == []
    _no_process_left(root)


def test_remote_callers_cannot_name_server_files_through_kwargs(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_ENV_HARBOR_TASKS_DIR", str(tmp_path))
    hello_task_dir(tmp_path, "t")
    endpoint = Endpoint(base_url="http://127.0.0.1:9", model="m")

    def req(**harbor):
        return RolloutRequest(harness="harbor", harbor={"task_dir": "t", **harbor}, endpoint=endpoint)

    assert prepare(req(agent_kwargs={"max_turns": 5}), trusted=False).harness_options.agent_kwargs == {"max_turns": 5}
    with pytest.raises(InvalidRequestError, match="prompt_template_path"):
        prepare(req(agent_kwargs={"prompt_template_path": "/etc/hostname"}), trusted=False)
    with pytest.raises(InvalidRequestError, match="sandbox_kwargs"):
        prepare(req(sandbox="docker", agent="nop", sandbox_kwargs={"keep_containers": True}), trusted=False)
    trusted = RolloutRequest(harness="harbor", harbor={"task_dir": str(tmp_path / "t"), "agent_kwargs": {"prompt_template_path": "/x"}}, endpoint=endpoint)
    assert prepare(trusted, trusted=True).harness_options.agent_kwargs  # the CLI may
    with pytest.raises(InvalidRequestError, match="task_family"):
        prepare(req().model_copy(update={"task_family": "svg_icon"}), trusted=True)


def test_links_in_a_dataset_do_not_lead_remote_callers_out_of_the_root(tmp_path, monkeypatch):
    root, outside = tmp_path / "root", tmp_path / "outside"
    hello_task_dir(outside, "secret-task")
    hello_task_dir(root / "ds", "a-task")
    (root / "ds" / "b-link").symlink_to(outside / "secret-task")  # a task entry that links out
    (root / "ds2").mkdir()
    (root / "ds2" / "train").symlink_to(outside)  # a split that links out
    monkeypatch.setenv("HARNESS_ENV_HARBOR_TASKS_DIR", str(root))
    listed = list_tasks("ds", trusted=False)
    assert [t.name for t in listed] == ["a-task", "b-link"]  # still counted, so task_index means the same
    assert "Write the word hello" not in listed[1].instruction and "must lie under" in listed[1].instruction
    endpoint = Endpoint(base_url="http://127.0.0.1:9", model="m")
    with pytest.raises(InvalidRequestError, match="must lie under"):
        prepare(RolloutRequest(harness="harbor", harbor={"dataset": "ds", "task_index": 1}, endpoint=endpoint), trusted=False)
    with pytest.raises(InvalidRequestError, match="split must lie under"):
        list_tasks("ds2", "train", trusted=False)
    with pytest.raises(InvalidRequestError, match="must lie under"):
        prepare(RolloutRequest(harness="harbor", harbor={"dataset": "ds2", "split": "train"}, endpoint=endpoint), trusted=False)
    assert [t.name for t in list_tasks(str(root / "ds2"), "train", trusted=True)] == ["secret-task"]  # the CLI may


def test_our_agent_timeout_caps_a_task_that_sets_none():
    from harness_env.envs.harbor.config import trial_config

    def cfg(task_timeout):
        return trial_config(
            HarborOptions(agent="pi"),
            task_dir=Path("/t"),
            trials_dir=Path("/r"),
            trial_name="n",
            proxy_base_url="http://127.0.0.1:9/v1",
            session_key="k",
            model="m",
            agent_timeout_s=30,
            setup_timeout_s=10,
            verify_timeout_s=20,
            task_agent_timeout_s=task_timeout,
        )

    assert cfg(None).agent.override_timeout_sec == 30
    assert cfg(600).agent.override_timeout_sec == 30
    assert cfg(12).agent.override_timeout_sec == 12
    assert cfg(12).verifier.max_timeout_sec == 20


def test_each_agent_gets_its_wire_format_base_url_and_native_config():
    from harness_env.envs.harbor.config import agent_config

    def cfg(agent, **kwargs):
        return agent_config(
            HarborOptions(agent=agent, agent_kwargs=kwargs),
            proxy_base_url="http://127.0.0.1:9/s/abc/v1",
            session_key="k",
            model="org/m",
            agent_timeout_s=30,
            setup_timeout_s=10,
        )

    pi, codex, claude, gemini = cfg("pi"), cfg("codex"), cfg("claude-code"), cfg("gemini-cli")
    assert (pi.model_api_format, pi.base_url, pi.model_name) == ("openai_chat_completions", "http://127.0.0.1:9/s/abc/v1", "harness-env/org/m")
    assert (codex.model_api_format, codex.base_url) == ("openai_responses", "http://127.0.0.1:9/s/abc/v1")
    provider = codex.kwargs["config"]["model_providers"][codex.kwargs["config"]["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:9/s/abc/v1" and provider["wire_api"] == "responses"
    assert provider["supports_websockets"] is False and codex.kwargs["config"]["otel"]["exporter"] == "none"
    assert (claude.model_api_format, claude.base_url) == ("anthropic_messages", "http://127.0.0.1:9/s/abc")  # the client adds /v1/messages
    assert "WebFetch" in claude.kwargs["config"]["permissions"]["deny"] and claude.env["ENABLE_TOOL_SEARCH"] == "false"
    assert (gemini.model_api_format, gemini.base_url, gemini.model_name) == ("google_generate_content", "http://127.0.0.1:9/s/abc", "gemini/org--m")
    assert all(c.env["HARNESS_ENV_CAPTURE_KEY"] == "k" and c.model_api_key_name == "HARNESS_ENV_CAPTURE_KEY" for c in (pi, codex, claude, gemini))
    # A caller's inline native config is merged in last (as harness_config is for the native harnesses).
    mine = cfg("codex", config={"model_reasoning_effort": "low"}).kwargs["config"]
    assert mine["model_reasoning_effort"] == "low" and mine["model_providers"][mine["model_provider"]]["wire_api"] == "responses"
    assert cfg("claude-code", config={"env": {"X": "1"}}).kwargs["config"]["env"] == {"X": "1"}


def test_gemini_cli_on_a_provider_sandbox_keeps_our_offline_settings(tmp_path):
    """On a provider's sandbox Harbor installs Gemini CLI itself; its settings.json still carries our
    offline table (no usage statistics, no web tools) beside Harbor's API-key auth."""
    from harbor.agents.factory import AgentFactory
    from harbor.models.agent.name import AgentName

    from harness_env.envs.gemini_cli.config import DENIED_TOOLS
    from harness_env.envs.harbor.config import agent_config

    config = agent_config(
        HarborOptions(agent="gemini-cli", sandbox="docker"),
        proxy_base_url="http://10.0.0.1:8100/capture/v1",
        session_key="k",
        model="org/m",
        agent_timeout_s=30,
        setup_timeout_s=10,
    )
    assert config.name is None and config.import_path == "harness_env.envs.harbor.agents:OfflineGeminiCli"
    agent = AgentFactory.create_agent_from_config(config, logs_dir=tmp_path)
    assert type(agent).install is AgentFactory.get_agent_class(AgentName("gemini-cli")).install  # Harbor's own installer
    settings, _ = agent._build_settings_config("gemini/org--m", "gemini-api-key")
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"  # Harbor's
    assert settings["privacy"]["usageStatisticsEnabled"] is False and settings["telemetry"]["enabled"] is False  # ours
    assert settings["general"]["enableAutoUpdate"] is False and set(DENIED_TOOLS) <= set(settings["tools"]["exclude"])


def test_verify_results_skip_lines_that_are_not_ours(tmp_path):
    """verify_results.jsonl is writable by the verify commands: junk lines are skipped, never a crash."""
    from harness_env.envs.harbor.harness import _verify_results
    from harness_env.envs.harbor.trial import HarborTrialOutcome

    (tmp_path / "verify_results.jsonl").write_bytes(
        b"\n".join(
            [
                b"[1]",
                b"7",
                b"\xff\xfe not utf-8",
                b'{"index": 0, "exit_code": 0, "duration_s": 1' + b"0" * 400 + b"}",
                b'{"index": 9, "exit_code": 0}',
                b'{"index": 0, "exit_code": 124, "duration_s": 3.25, "timed_out": true}',
                b'{"index": 1, "exit_code": 1, "duration_s": 0.01, "timed_out": false}',
            ]
        )
    )
    results = _verify_results(HarborTrialOutcome(verifier_dir=tmp_path), ["sleep 600", "false"])
    assert [(r.cmd, r.exit_code, r.timed_out, r.duration_s) for r in results] == [("sleep 600", None, True, 3.25), ("false", 1, False, 0.01)]


def test_agent_logs_are_read_from_their_tail_only(tmp_path):
    """An agent can write logs as large as it likes: the result gets their tail, read without
    loading the whole file."""
    from harness_env.envs.harbor.harness import LOG_TAIL_CHARS, _agent_log_tail

    (tmp_path / "command-0.txt").write_text("é" * (LOG_TAIL_CHARS * 3) + "THE END")
    tail = _agent_log_tail(tmp_path)
    assert tail.endswith("THE END") and len(tail) == LOG_TAIL_CHARS and "\ufffd" not in tail[1:]


def test_logs_and_verify_output_that_are_links_or_fifos_are_skipped_without_waiting(tmp_path):
    """The trial's copies are regular files, but a provider's download can bring links (inside its
    target) and our readers must not depend on that: links are never followed, FIFOs never opened
    blocking."""
    import concurrent.futures

    from harness_env.envs.harbor.harness import _agent_log_tail, _verify_results
    from harness_env.envs.harbor.trial import HarborTrialOutcome, read_trajectory

    secret = tmp_path / "secret.txt"
    secret.write_text("host-secret-1f2e")
    agent, verifier = tmp_path / "agent", tmp_path / "verifier"
    agent.mkdir()
    verifier.mkdir()
    (agent / "a.txt").write_text("agent says hi")
    (agent / "leak.txt").symlink_to(secret)
    os.mkfifo(agent / "pipe.txt")
    os.mkfifo(agent / "trajectory.json")
    (verifier / "test-stdout.txt").symlink_to(secret)
    os.mkfifo(verifier / "verify_results.jsonl")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        tail = pool.submit(_agent_log_tail, agent).result(timeout=10)
        results = pool.submit(_verify_results, HarborTrialOutcome(verifier_dir=verifier), ["true"]).result(timeout=10)
        trajectory, note = pool.submit(read_trajectory, agent).result(timeout=10)
    assert "agent says hi" in tail and "host-secret-1f2e" not in tail
    assert results == []
    assert trajectory is None and "FIFO" in note
    (agent / "trajectory.json").unlink()
    (agent / "trajectory.json").symlink_to(secret)
    trajectory, note = read_trajectory(agent)
    assert trajectory is None and "symbolic link" in note


@pytest.fixture(scope="module")
def agent_image(tmp_path_factory, registry_host):  # noqa: F811 - the fixture imported above
    """An image on the loopback registry with a Harbor trial's programs and what a distribution has
    for Node (glibc, libstdc++), but neither Node nor any agent's CLI: `only-in-image`, WorkingDir /srv/app."""
    from tests.envs.harbor.test_local_trial import TRIAL_PROGRAMS

    layout = _build_image(tmp_path_factory.mktemp("agent-image"), programs=TRIAL_PROGRAMS, libraries_of=(toolchain.harness_command("pi")[0],))
    return push(layout, f"{registry_host}/test/agents:1")  # pulled from the loopback registry


@pytest.mark.e2e
@pytest.mark.parametrize("agent", ["pi", "codex"])
async def test_harbors_agents_run_in_the_tasks_docker_image(policy_server, tmp_path, agent_image, agent):
    from tests.envs.harnesses import installed

    installed(agent)
    task_dir = hello_task_dir(
        tmp_path,
        solve=False,
        test_sh=("#!/bin/bash\nif grep -qx image-ok /app/hello.txt; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"),
    )
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text().replace("[environment]", f"[environment]\ndocker_image = {json.dumps(agent_image)}", 1))
    script = [{"bash": "only-in-image > /app/hello.txt"}, {"text": "done"}]
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(task_dir), "agent": agent}, script=script))
    assert (res.reward, res.error) == (1.0, None), (res.error, res.agent_log_tail)
    assert [t.purpose for t in res.proxy_turns].count("policy") == 2


# -- a task's Dockerfile, built with buildah when the operator allows it (core/sandbox/build.py)

BUILT_TEST_SH = (
    "#!/bin/bash\nif grep -qx built /app/hello.txt && grep -qx copied /opt/note.txt; then echo 1 > /logs/verifier/reward.txt; "
    "else echo 0 > /logs/verifier/reward.txt; fi\n"
)


def dockerfile_task(root, base: str, run: str):
    """A Harbor task whose environment is a Dockerfile only: FROM `base`, then `run`; its oracle
    runs `built-here`, a program the RUN step makes."""
    task_dir = hello_task_dir(root, solve=False, test_sh=BUILT_TEST_SH)
    env = task_dir / "environment"
    for p in env.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    (env / "Dockerfile").write_text(f"FROM {base}\nUSER 0\nRUN {run}\nCOPY note.txt /opt/note.txt\n")
    (env / "note.txt").write_text("copied\n")
    (task_dir / "solution").mkdir()
    (task_dir / "solution" / "solve.sh").write_text("#!/usr/bin/env bash\nbuilt-here > /app/hello.txt\n")
    return task_dir


MAKE_PROGRAM = "mkdir -p /usr/local/bin && printf '#!/bin/sh\\necho built\\n' > /usr/local/bin/built-here && chmod 755 /usr/local/bin/built-here"


@pytest.fixture(scope="module")
def base_image(agent_image):
    return agent_image  # on the loopback registry: the build pulls it over plain HTTP


async def test_a_dockerfile_is_built_once_when_builds_are_allowed_and_ignored_when_not(policy_server, tmp_path, base_image, monkeypatch):
    from harness_env.core.sandbox import build
    from harness_env.core.sandbox.build import BUILD_VAR

    task_dir = dockerfile_task(tmp_path, base_image, MAKE_PROGRAM)
    monkeypatch.delenv(BUILD_VAR, raising=False)
    on_host = await run_rollout(harbor_request(policy_server, {"task_dir": str(task_dir), "agent": "oracle"}))
    assert on_host.reward == 0.0 and [n for n in _cache_entries() if n.startswith("build-")] == []  # built-here exists nowhere
    monkeypatch.setenv(BUILD_VAR, "1")
    built = await run_rollout(harbor_request(policy_server, {"task_dir": str(task_dir), "agent": "oracle"}))
    assert (built.reward, built.error) == (1.0, None), built.error
    [entry] = [n for n in _cache_entries() if n.startswith("build-")]
    builds = []
    monkeypatch.setattr(build, "_build", lambda *a: builds.append(a))  # a second build would be recorded, not run
    again = await run_rollout(harbor_request(policy_server, {"task_dir": str(task_dir), "agent": "oracle"}))
    assert again.reward == 1.0 and builds == [] and [n for n in _cache_entries() if n.startswith("build-")] == [entry]
    assert not any(n.startswith("harness-env-tmp-") for n in _cache_entries())


async def test_a_build_that_fails_or_cannot_run_is_one_sandbox_error_and_leaves_nothing(policy_server, tmp_path, base_image, monkeypatch):
    from harness_env.core.sandbox import build
    from harness_env.core.sandbox.build import BUILD_VAR

    monkeypatch.setenv(BUILD_VAR, "1")
    failing = dockerfile_task(tmp_path / "a", base_image, "echo nope >&2; exit 3")
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(failing), "agent": "oracle"}))
    assert (res.reward, res.error_kind) == (None, "sandbox") and "could not build the task's Dockerfile" in res.error, res.error
    assert not any(n.startswith(("build-", "harness-env-tmp-")) for n in _cache_entries())
    monkeypatch.setattr(build, "find_buildah", lambda: None)  # buildah not installed
    res = await run_rollout(harbor_request(policy_server, {"task_dir": str(dockerfile_task(tmp_path / "b", base_image, MAKE_PROGRAM)), "agent": "oracle"}))
    assert (res.reward, res.error_kind) == (None, "sandbox") and "apt-get install buildah" in res.error, res.error


def test_the_build_key_and_the_base_images_a_dockerfile_names(tmp_path):
    from harness_env.core.sandbox.build import base_images, context_key, plain_http

    (tmp_path / "Dockerfile").write_text("FROM a\n")
    (tmp_path / "f").write_text("1")
    key = context_key(tmp_path, tmp_path / "Dockerfile")
    (tmp_path / "f").write_text("2")
    assert context_key(tmp_path, tmp_path / "Dockerfile") != key  # a context file's content is part of the key
    (tmp_path / "f").write_text("1")
    assert context_key(tmp_path, tmp_path / "Dockerfile") == key
    text = "FROM --platform=linux/amd64 127.0.0.1:5000/a/b:1 AS build\nRUN x\nFROM build\nFROM scratch\n"
    assert base_images(text) == ["127.0.0.1:5000/a/b:1"] and plain_http(text)
    assert not plain_http(text + "FROM registry.example/c:2\n") and not plain_http("FROM scratch\n")
