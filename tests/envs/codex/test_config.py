import shlex
import tomllib

from harness_env.envs.codex.config import KEY_ENV, OFFLINE_SETTINGS, PROVIDER, codex_argv, codex_env, config_toml, offline_overrides, to_toml


def _config(**kw):
    return tomllib.loads(config_toml(proxy_base_url="http://127.0.0.1:18080/v1", model="Qwen/Q", **kw))


def test_the_only_provider_is_the_proxy_speaking_responses_with_the_key_from_the_environment():
    cfg = _config()
    assert cfg["model"] == "Qwen/Q" and cfg["model_provider"] == PROVIDER
    p = cfg["model_providers"][PROVIDER]
    assert p["base_url"] == "http://127.0.0.1:18080/v1" and p["wire_api"] == "responses" and p["env_key"] == KEY_ENV
    assert p["supports_websockets"] is False and p["request_max_retries"] <= 2 and p["stream_max_retries"] <= 2
    assert "hecap" not in config_toml(proxy_base_url="http://x/v1", model="m")  # the key is never in the file


def test_nothing_leaves_the_machine_and_nothing_asks_for_approval():
    cfg = _config()
    assert cfg["check_for_update_on_startup"] is False and cfg["web_search"] == "disabled"
    assert cfg["analytics"]["enabled"] is False and cfg["feedback"]["enabled"] is False and cfg["otel"]["exporter"] == "none"
    assert cfg["features"]["plugins"] is False and cfg["features"]["apps"] is False and cfg["history"]["persistence"] == "none"
    assert cfg["approval_policy"] == "never" and cfg["sandbox_mode"] == "danger-full-access"


def test_harness_config_is_deep_merged_last():
    cfg = _config(extra={"features": {"shell_snapshot": True}, "model_providers": {PROVIDER: {"stream_idle_timeout_ms": 5000}}, "new": [1, "a"]})
    assert cfg["features"]["shell_snapshot"] is True and cfg["features"]["plugins"] is False
    assert cfg["model_providers"][PROVIDER]["stream_idle_timeout_ms"] == 5000 and cfg["model_providers"][PROVIDER]["wire_api"] == "responses"
    assert cfg["new"] == [1, "a"]


def test_toml_writer_round_trips_awkward_strings_and_keys():
    value = {"a": 'quo"te \\ back\nline ü', "odd key.x": True, "t": {"n": 1.5, "deep": {"m": ["x", 2]}}, "only": {"tables": {"z": 0}}}
    assert tomllib.loads(to_toml(value)) == value


def test_offline_overrides_say_the_same_as_the_config():
    args = offline_overrides()
    assert args[::2] == ["-c"] * (len(args) // 2)
    parsed = {}
    for kv in args[1::2]:
        key, _, raw = kv.partition("=")
        node = parsed
        *path, last = key.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = tomllib.loads(f"v = {raw}")["v"]
    assert parsed == OFFLINE_SETTINGS


def test_env_names_the_home_and_holds_the_session_key():
    env = codex_env("/h/.codex", "hecap-k")
    assert env == {"CODEX_HOME": "/h/.codex", KEY_ENV: "hecap-k"}


def test_argv_is_exec_json_no_git_check_no_sandbox_nothing_persisted():
    argv = codex_argv(["/t/codex"], instruction="do it")
    for flag in ("--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--ephemeral"):
        assert flag in argv
    assert argv[:2] == ["/t/codex", "exec"] and argv[-2:] == ["--", "do it"]


def test_a_prompt_like_a_flag_a_subcommand_or_stdin_stays_a_prompt():
    for instr in ("--help me; rm -rf / $(echo 'x') \"q\"", "resume", "-"):
        argv = codex_argv(["codex"], instruction=instr)
        assert argv[-2] == "--" and argv[-1].strip() == instr
        assert shlex.split(shlex.join(argv)) == argv
    assert codex_argv(["codex"], instruction="-")[-1] == " -"
