import json
import shlex

from harness_env.envs.pi.config import PROVIDER, models_json, pi_argv, pi_env, pi_stdin, settings_json, shell_line


def test_models_json_points_at_the_proxy_with_the_session_key():
    cfg = json.loads(models_json(proxy_base_url="http://127.0.0.1:5/v1", session_key="hecap-k", model="Qwen/Q", max_tokens=512))
    p = cfg["providers"][PROVIDER]
    assert p["baseUrl"] == "http://127.0.0.1:5/v1" and p["apiKey"] == "hecap-k" and p["api"] == "openai-completions"
    [m] = p["models"]
    assert m["id"] == "Qwen/Q" and m["maxTokens"] == 512 and m["reasoning"] is False
    assert set(m["cost"]) == {"input", "output", "cacheRead", "cacheWrite"}


def test_settings_disable_telemetry_and_bound_retries():
    s = json.loads(settings_json())
    assert s["enableInstallTelemetry"] is False and s["retry"]["maxRetries"] <= 2


def test_env_is_offline():
    env = pi_env("/x/agent")
    assert env["PI_CODING_AGENT_DIR"] == "/x/agent" and env["PI_OFFLINE"] == "1" and env["PI_SKIP_VERSION_CHECK"] == "1"


def test_argv_is_print_json_no_session_nothing_discovered():
    argv = pi_argv(["node", "cli.js"], model="m", instruction="do it")
    for flag in ("--print", "--no-session", "--offline", "--no-context-files", "--no-extensions", "--no-skills", "--no-prompt-templates"):
        assert flag in argv
    assert argv[argv.index("--mode") + 1] == "json"
    assert argv[argv.index("--provider") + 1] == PROVIDER and argv[-1] == "do it"


def test_prompt_starting_with_dash_stays_a_prompt_and_quoting_roundtrips():
    instr = "--help me; rm -rf / $(echo 'x') \"q\""
    argv = pi_argv(["node", "cli.js"], model="m", instruction=instr)
    assert argv[-2:] == ["--", instr] and pi_stdin(instr) is None  # as written, no space added
    assert shlex.split(shell_line(argv)) == argv


def test_prompt_naming_a_file_goes_on_stdin():
    # Pi reads "@x" as a file to attach, even after "--".
    argv = pi_argv(["node", "cli.js"], model="m", instruction="@notes.txt says hi")
    assert "@notes.txt says hi" not in argv and "--" not in argv and pi_stdin("@notes.txt says hi") == "@notes.txt says hi"
