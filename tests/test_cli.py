"""The `harness-env` command as a user runs it."""

import json
import os
import subprocess
import sys

import pytest

from harness_env.storage import ROW_COLUMNS

CLI = [sys.executable, "-m", "harness_env.cli"]


def _run(args, **kw):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.parametrize(
    "setup,args,expect",
    [
        (None, ["--task", "missing.json"], "cannot read task file"),
        ("{not json", ["--task", "t.json"], "not valid JSON"),
        ('["a list"]', ["--task", "t.json"], "JSON object"),
        ('{"verify": ["true"]}', ["--task", "t.json"], "task.instruction: Field required"),
        ('{"instruction": "x", "files": {"../up.txt": "x"}}', ["--task", "t.json"], "inside the workspace"),
        ('{"instruction": "x"}', ["--task", "t.json", "--max-turns", "0"], "max_turns"),
        ('{"instruction": "x"}', ["--task", "t.json", "--agent-timeout-s", "nan"], "agent_timeout_s"),
        ('{"instruction": "x"}', ["--task", "t.json", "--harness", "nope"], "unknown harness 'nope'"),
        ('{"instruction": "x"}', ["--task", "t.json", "--top-logprobs", "abc"], "invalid int value"),
        ('{"instruction": "x"}', ["--task", "t.json", "--api-key-env", "NOPE_UNSET_VAR"], "NOPE_UNSET_VAR"),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(tmp_path, setup, args, expect):
    if setup is not None:
        (tmp_path / "t.json").write_text(setup)
    p = _run(["run", *args, "--base-url", "http://127.0.0.1:9/v1", "--model", "m"], cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0], p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "flag,env,given", [(["--sandbox-backend", "nope"], {}, "--sandbox-backend"), ([], {"HARNESS_ENV_SANDBOX_BACKEND": "nope"}, "$HARNESS_ENV_SANDBOX_BACKEND")]
)
def test_an_unknown_sandbox_backend_stops_serve_in_one_line(flag, env, given):
    p = _run(["serve", "--port", "0", *flag], env={**os.environ, **env})
    assert p.returncode == 2 and p.stderr.strip() == f"harness-env: error: unknown {given} 'nope'; choose one of: local", p.stderr


def test_missing_required_flag_is_one_line(tmp_path):
    p = _run(["run"])
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "--task" in p.stderr
    (tmp_path / "t.json").write_text('{"instruction": "x"}')
    p = _run(["run", "--task", "t.json"], cwd=tmp_path)  # an agent that calls a model needs an endpoint
    assert p.returncode == 2 and p.stderr.strip() == (
        "harness-env: error: no policy endpoint: pass --base-url and --model, or --endpoint vllm|openai|hf_router"
    )


def test_version():
    from importlib.metadata import version

    p = _run(["--version"])
    assert p.returncode == 0 and p.stdout.strip() == f"harness-env {version('harness-env')}"


def test_every_flag_of_every_command_has_help():
    """Walks the parser: no flag without help, and every option flag of run shows its default."""
    import argparse

    from harness_env import cli

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, [*path, name])
            elif action.option_strings:
                yield path, action

    seen = 0
    for path, action in walk(cli.build_parser(), ["harness-env"]):
        seen += 1
        assert action.help and action.help != argparse.SUPPRESS, (path, action.option_strings)
        if (
            path[1:] in (["run"], ["serve"])
            and not isinstance(action, (argparse._HelpAction, argparse._StoreTrueAction))
            and action.option_strings[0] not in ("--task", "--api-key", "--api-key-env", "--out", "--rows-out", "--endpoint", "--base-url", "--model")
        ):
            assert "default" in action.help, (path, action.option_strings)
    assert seen > 40
    serve_help = _run(["serve", "--help"]).stdout
    for face in ("/web", "/mcp", "/docs", "/health", "default: 8100"):
        assert face in serve_help, face
    top = _run(["--help"]).stdout
    assert "examples:" in top and "harness-env run" in top and "harness-env serve" in top


def test_endpoint_from_the_catalog_as_on_a_server(tmp_path, monkeypatch):
    from harness_env import cli
    from harness_env.cli_request import run_request

    (tmp_path / "t.json").write_text('{"instruction": "x"}')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VLLM_URL", "http://127.0.0.1:8000")
    monkeypatch.setenv("VLLM_MODEL", "Qwen/Qwen3-8B")
    request, _ = run_request(cli.build_parser().parse_args(["run", "--task", "t.json", "--endpoint", "vllm"]))
    assert (request.endpoint.base_url, request.endpoint.model) == ("http://127.0.0.1:8000/v1", "Qwen/Qwen3-8B")
    request, _ = run_request(cli.build_parser().parse_args(["run", "--task", "t.json", "--endpoint", "vllm", "--model", "mine"]))
    assert request.endpoint.model == "mine"  # an explicit flag wins
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    p = _run(["run", "--task", "t.json", "--endpoint", "openai"], cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"})
    assert p.returncode == 2 and "OPENAI_API_KEY" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_the_cli_and_the_server_resolve_the_same_arguments_to_the_same_request(tmp_path, monkeypatch):
    """One resolver (core/catalog.to_request): a command line and the tool's arguments that say the
    same give the same request, the endpoint kind's defaults (thinking, top_logprobs' cap) included."""
    from harness_env import cli
    from harness_env.cli_request import run_request
    from harness_env.core.catalog import to_request
    from harness_env.models import RolloutArgs

    monkeypatch.setenv("HF_ROUTER_API_KEY", "hf-key")
    monkeypatch.setenv("HF_ROUTER_MODEL", "Qwen/Qwen3-8B")
    task = {"instruction": "x", "setup": ["true"], "verify": ["test -f a.txt"], "files": {"a.txt": "a"}, "task_id": "t1"}
    (tmp_path / "t.json").write_text(json.dumps(task))
    monkeypatch.chdir(tmp_path)
    flags = ["--endpoint", "hf_router", "--max-tokens", "100", "--max-turns", "3", "--top-logprobs", "20", "--network", "open"]
    request, _ = run_request(cli.build_parser().parse_args(["run", "--task", "t.json", *flags]))
    args = RolloutArgs(**task, endpoint="hf_router", harness="whitebox", harness_options={"max_tokens": 100}, max_turns=3, top_logprobs=20, network="open")
    assert request == to_request(args, trusted=False)
    assert (request.harness, request.top_logprobs, request.disable_thinking) == ("whitebox", 5, True)


def test_a_task_file_keeps_its_metadata_and_a_local_image(tmp_path, monkeypatch):
    # What the flat arguments cannot carry (metadata), and what only a caller on this machine may name.
    task = {"instruction": "x", "metadata": {"source": "mine"}, "image": "oci-archive:/srv/images/task.tar"}
    request, _ = _request(tmp_path, monkeypatch, task=task)
    assert (request.task.metadata, request.task.image) == ({"source": "mine"}, "oci-archive:/srv/images/task.tar")


def test_an_agent_that_calls_no_model_needs_no_endpoint(tmp_path, monkeypatch):
    from harness_env import cli
    from harness_env.cli_request import run_request
    from harness_env.models import NO_MODEL_ENDPOINT

    (tmp_path / "t.json").write_text('{"instruction": "x", "verify": ["true"]}')
    monkeypatch.chdir(tmp_path)
    request, _ = run_request(cli.build_parser().parse_args(["run", "--task", "t.json", "--agent", "oracle"]))
    assert request.endpoint == NO_MODEL_ENDPOINT and not request.agent_calls_model
    with pytest.raises(SystemExit) as stopped:  # Harbor's pi agent calls one
        run_request(cli.build_parser().parse_args(["run", "--task", "t.json", "--agent", "pi"]))
    assert stopped.value.code == 2


@pytest.mark.e2e
def test_run_prints_result_json_and_progress(tmp_path, policy_server):
    policy_server.policy.scripts["m"] = [{"bash": "printf 'hello\\n' > hello.txt"}, {"text": "done"}]
    (tmp_path / "task.json").write_text(json.dumps({"instruction": "make hello.txt", "verify": ["grep -q hello hello.txt"], "task_id": "cli-1"}))
    p = _run(
        [
            "run",
            "--harness",
            "pi",
            "--task",
            "task.json",
            "--base-url",
            policy_server.base_url,
            "--api-key",
            "KEY",
            "--model",
            "m",
            "--max-turns",
            "5",
            "--top-logprobs",
            "1",
            "--max-tokens-cap",
            "256",
        ],
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["reward"] == 1.0 and result["task_id"] == "cli-1" and result["error"] is None
    for phase in ("setup", "agent", "verify"):
        assert f"{phase}: started" in p.stderr
    out = _run(["run", "--task", "task.json", "--base-url", policy_server.base_url, "--model", "m", "--out", "r.json", "--quiet"], cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "" and out.stderr == ""
    assert json.loads((tmp_path / "r.json").read_text())["reward"] == 1.0


@pytest.mark.e2e
def test_infrastructure_failure_still_exits_0_with_a_result(tmp_path):
    (tmp_path / "task.json").write_text(json.dumps({"instruction": "x", "verify": ["true"]}))
    p = _run(["run", "--task", "task.json", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--quiet"], cwd=tmp_path)
    assert p.returncode == 0
    r = json.loads(p.stdout)
    assert r["error_kind"] == "endpoint" and r["reward"] is None


@pytest.mark.e2e
def test_whitebox_run_writes_training_rows(tmp_path, policy_server):
    policy_server.policy.scripts["m"] = [{"bash": "echo hi > hello.txt"}, {"text": "done"}]
    (tmp_path / "task.json").write_text(json.dumps({"instruction": "make hello.txt", "verify": ["test -f hello.txt"]}))
    p = _run(
        [
            "run",
            "--harness",
            "whitebox",
            "--task",
            "task.json",
            "--base-url",
            policy_server.base_url,
            "--model",
            "m",
            "--rows-out",
            "rows.jsonl",
            "--out",
            "r.json",
            "--max-tokens",
            "77",
            "--quiet",
        ],
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert [r["max_tokens"] for r in policy_server.policy.tool_requests()] == [77, 77]  # the white-box option, from its flag
    result = json.loads((tmp_path / "r.json").read_text())
    (row,) = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert result["reward"] == 1.0 and result["harness"] == "whitebox" and result["graph"]["branches"] == 1
    assert row["reward"] == 1.0 and row["trainable"] and row["turn_indices"] == [0, 1]
    assert row["rollout_id"] == result["rollout_id"] != result["sandbox_id"]  # joins to its result
    assert tuple(row) == ROW_COLUMNS and row["attempt"] == 0  # the export's rows table's layout
    assert row["prompt_ids"] and len(row["completion_ids"]) == len(row["loss_mask"]) == len(row["logprobs"])
    assert sum(row["loss_mask"]) == result["graph"]["trainable_tokens"] > 0
    compact = _run(
        [
            "run",
            "--harness",
            "whitebox",
            "--task",
            "task.json",
            "--base-url",
            policy_server.base_url,
            "--model",
            "m",
            "--compact",
            "--out",
            "c.json",
            "--quiet",
        ],
        cwd=tmp_path,
    )
    assert compact.returncode == 0, compact.stderr
    from harness_env.storage import load

    stored = load(tmp_path / "c.json")
    assert stored.reward == 1.0 and (
        stored.proxy_turns[1].prompt_token_ids[: len(stored.proxy_turns[0].prompt_token_ids)] == stored.proxy_turns[0].prompt_token_ids
    )


def test_svg_dataset_subcommand_reports_bad_input_in_one_line(tmp_path):
    p = _run(["svg-dataset", "--parquet", str(tmp_path / "missing.parquet"), "--out", str(tmp_path / "out")])
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [f"harness-env svg-dataset: error: parquet file {tmp_path / 'missing.parquet'} not found"]


@pytest.mark.e2e
def test_svg_icon_task_file(tmp_path, policy_server):
    import resvg_py

    from tests.fakes.judge import FakeJudge, FakeJudgeServer

    svg = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10"><circle cx="5" cy="5" r="4" fill="#00f"/></svg>'
    policy_server.policy.scripts["m"] = [{"bash": f"printf '%s' '{svg}' > icon.svg"}, {"text": "drawn"}]
    (tmp_path / "ref.png").write_bytes(resvg_py.svg_to_bytes(svg_string=svg, width=64, height=64, background="#ffffff"))
    (tmp_path / "icon.json").write_text(
        json.dumps({"task_family": "svg_icon", "prompt": "a blue dot", "reference_png": "ref.png", "renderer": "resvg", "max_turns": 4})
    )
    judge = FakeJudge(expect_images=2)
    with FakeJudgeServer(judge) as srv:
        env = {**os.environ, "HARNESS_ENV_JUDGE_BASE_URL": srv.base_url, "HARNESS_ENV_JUDGE_MODEL": "vl"}
        p = _run(["run", "--task", "icon.json", "--base-url", policy_server.base_url, "--model", "m", "--quiet"], cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["reward"] == 0.8 and result["reward_source"] == "judge" and judge.problems == []
    assert result["grading"]["page_valid"] and len(policy_server.policy.tool_requests()) == 2


def _request(tmp_path, monkeypatch, *args, task: dict | None = None):
    """The request `harness-env run` would run (in-process; nothing runs)."""
    from harness_env import cli
    from harness_env.cli_request import run_request

    (tmp_path / "t.json").write_text(json.dumps(task or {"instruction": "x", "verify": ["true"]}))
    monkeypatch.chdir(tmp_path)
    parsed = cli.build_parser().parse_args(["run", "--task", "t.json", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", *args])
    return run_request(parsed)


def test_flags_not_given_leave_the_fields_defaults(tmp_path, monkeypatch):
    from harness_env.models import RolloutRequest

    request, sandbox = _request(tmp_path, monkeypatch)
    defaults = RolloutRequest(task={"instruction": "x", "verify": ["true"]}, endpoint={"base_url": "http://127.0.0.1:9/v1", "model": "m"})
    assert request == defaults and sandbox.use_bwrap is None


def test_every_option_flag_reaches_the_request(tmp_path, monkeypatch):
    request, sandbox = _request(
        tmp_path,
        monkeypatch,
        "--harness",
        "opencode",
        "--mode",
        "black_box",
        "--harness-config",
        '{"a": {"b": 1}}',
        "--max-turns",
        "7",
        "--agent-timeout-s",
        "60",
        "--setup-timeout-s",
        "30",
        "--verify-timeout-s",
        "20",
        "--max-tokens-cap",
        "256",
        "--top-logprobs",
        "3",
        "--temperature",
        "0",
        "--reward-mode",
        "tool_efficiency",
        "--memory-limit-mb",
        "512",
        "--pids-limit",
        "64",
        "--disk-limit-mb",
        "128",
        "--cpu-limit",
        "1.5",
        "--network",
        "open",
        "--disable-thinking",
        "--sandbox",
        "plain",
    )
    assert (request.harness, request.mode, request.harness_config, request.max_turns) == ("opencode", "black_box", {"a": {"b": 1}}, 7)
    assert (request.agent_timeout_s, request.setup_timeout_s, request.verify_timeout_s) == (60, 30, 20)
    assert (request.max_tokens_cap, request.top_logprobs, request.temperature, request.reward_mode) == (256, 3, 0.0, "tool_efficiency")
    assert (request.memory_limit_mb, request.pids_limit, request.disk_limit_mb, request.cpu_limit, request.network) == (512, 64, 128, 1.5, "open")
    assert request.disable_thinking and request.harness_options is None and sandbox.use_bwrap is False


def test_a_family_record_s_limits_apply_unless_given(tmp_path, monkeypatch):
    record = {"task_family": "svg_icon", "prompt": "a red dot", "max_turns": 4, "agent_timeout_s": 90, "renderer": "resvg"}
    request, _ = _request(tmp_path, monkeypatch, task=record)
    assert (request.task_family, request.max_turns, request.agent_timeout_s) == ("svg_icon", 4, 90)
    assert request.family_options == {"renderer": "resvg"} and request.task.instruction == "a red dot"
    request, _ = _request(tmp_path, monkeypatch, "--max-turns", "9", "--family-options", '{"renderer": "chromium"}', task=record)
    assert (request.max_turns, request.agent_timeout_s, request.family_options) == (9, 90, {"renderer": "chromium"})


def test_a_harness_s_own_flags_select_it_and_fill_its_options(tmp_path, monkeypatch):
    request, sandbox = _request(
        tmp_path, monkeypatch, "--agent", "oracle", "--agent-kwargs", '{"max_turns": 3}', "--sandbox", "docker", "--reward-key", "score"
    )
    assert request.harness == "harbor" and sandbox.use_bwrap is None  # --sandbox docker is Harbor's, not the local sandbox's
    assert request.harness_options.model_dump(exclude_defaults=True) == {
        "agent": "oracle",
        "agent_kwargs": {"max_turns": 3},
        "sandbox": "docker",
        "reward_key": "score",
    }
    request, _ = _request(tmp_path, monkeypatch, "--harness", "harbor", "--sandbox", "bwrap")  # the command's own value: Harbor's default
    assert request.harness_options.model_dump(exclude_defaults=True) == {} and request.task.instruction == "x"


def test_help_shows_each_flag_s_default(tmp_path):
    p = _run(["run", "--help"])
    assert p.returncode == 0
    help_text = " ".join(p.stdout.split())
    for expected in (
        "--agent-timeout-s AGENT_TIMEOUT_S seconds the agent may run before it is stopped (default: 600.0)",
        "--top-logprobs TOP_LOGPROBS",
        "(default: transparent_proxy)",
        "Harbor options (--harness harbor):",
        "--task-index TASK_INDEX",
        "sandbox limits:",
    ):
        assert expected in help_text, expected
