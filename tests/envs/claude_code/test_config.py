import json
import shlex

from harness_env.envs.claude_code.config import DENIED_TOOLS, KEY_ENV, OFFLINE_ENV, claude_argv, claude_env, settings_json


def test_the_proxy_root_is_the_base_url_and_the_session_key_the_api_key():
    env = claude_env(proxy_base_url="http://127.0.0.1:18080/capture/v1", session_key="hecap-k", config_dir="/h/.claude", agent_timeout_s=600)
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18080/capture" and env[KEY_ENV] == "hecap-k" and KEY_ENV == "ANTHROPIC_API_KEY"
    assert env["CLAUDE_CONFIG_DIR"] == "/h/.claude"


def test_nothing_leaves_the_machine_and_the_bypass_flag_is_allowed_in_our_sandbox():
    env = claude_env(proxy_base_url="http://x/v1", session_key="k", config_dir="/c", agent_timeout_s=600)
    for name in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_AUTOUPDATER", "DISABLE_TELEMETRY", "DISABLE_ERROR_REPORTING"):
        assert env[name] == "1" and OFFLINE_ENV[name] == "1"
    assert env["IS_SANDBOX"] == "1"  # it refuses --dangerously-skip-permissions as root without it
    assert env["ENABLE_TOOL_SEARCH"] == "false" and int(env["CLAUDE_CODE_MAX_RETRIES"]) <= 2


def test_a_call_may_wait_as_long_as_the_rollout_not_claude_codes_own_600_s():
    # Past API_TIMEOUT_MS it abandons the call and sends it again: a slow engine computes it twice.
    env = claude_env(proxy_base_url="http://x/v1", session_key="k", config_dir="/c", agent_timeout_s=1800.5)
    assert env["API_TIMEOUT_MS"] == "1800500"


def test_settings_deny_the_network_tools_and_take_harness_config_last():
    settings = json.loads(settings_json())
    assert settings == {"permissions": {"deny": list(DENIED_TOOLS)}} and {"WebFetch", "WebSearch"} <= set(DENIED_TOOLS)
    merged = json.loads(settings_json({"env": {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096"}, "permissions": {"allow": ["Bash"]}}))
    assert merged == {"permissions": {"deny": list(DENIED_TOOLS), "allow": ["Bash"]}, "env": {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096"}}
    assert "hecap" not in settings_json()  # the key is never in a file


def test_a_callers_deny_list_adds_to_the_network_tools_never_replaces_them():
    merged = json.loads(settings_json({"permissions": {"deny": ["Agent", "WebFetch", "Monitor"]}}))
    assert merged["permissions"]["deny"] == [*DENIED_TOOLS, "Agent", "Monitor"]
    # A deny that is not a list is dropped, never written as ours.
    assert json.loads(settings_json({"permissions": {"deny": "Agent"}}))["permissions"]["deny"] == list(DENIED_TOOLS)
    assert json.loads(settings_json({"permissions": "none"}))["permissions"]["deny"] == list(DENIED_TOOLS)


def test_argv_is_print_mode_stream_json_no_prompts_nothing_persisted():
    argv = claude_argv(["/t/claude"], model="Qwen/Q", instruction="do it")
    assert argv[:2] == ["/t/claude", "-p"] and argv[-2:] == ["--", "do it"]
    assert argv[argv.index("--output-format") + 1] == "stream-json" and argv[argv.index("--model") + 1] == "Qwen/Q"
    for flag in ("--verbose", "--dangerously-skip-permissions", "--no-session-persistence", "--strict-mcp-config"):
        assert flag in argv


def test_a_prompt_like_a_flag_or_stdin_stays_a_prompt():
    for instr in ("--help me; rm -rf / $(echo 'x') \"q\"", "-", "doctor"):
        argv = claude_argv(["claude"], model="m", instruction=instr)
        assert argv[-2:] == ["--", instr]
        assert shlex.split(shlex.join(argv)) == argv
