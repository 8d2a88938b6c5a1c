import json
import shlex

import pytest

from harness_env.envs.gemini_cli.config import DENIED_TOOLS, KEY_ENV, gemini_argv, gemini_env, model_in_path, settings_json


def test_the_proxy_root_is_the_base_url_and_the_session_key_the_api_key():
    env = gemini_env(proxy_base_url="http://127.0.0.1:18080/capture/v1", session_key="hecap-k", cli_home="/h")
    assert env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:18080/capture" and env[KEY_ENV] == "hecap-k" and KEY_ENV == "GEMINI_API_KEY"
    assert env["GEMINI_CLI_HOME"] == "/h" and env["GEMINI_TELEMETRY_ENABLED"] == "false" and env["GEMINI_CLI_NO_RELAUNCH"] == "true"


def test_settings_select_the_api_key_and_keep_it_offline_harness_config_last():
    settings = json.loads(settings_json())
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["general"]["enableAutoUpdate"] is False and settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False and settings["tools"]["useRipgrep"] is False
    assert set(settings["tools"]["exclude"]) == set(DENIED_TOOLS) == {"web_fetch", "google_web_search"}
    assert settings["general"]["maxAttempts"] <= 2
    merged = json.loads(settings_json({"model": {"maxSessionTurns": 20}, "general": {"maxAttempts": 3}}))
    assert merged["model"] == {"maxSessionTurns": 20} and merged["general"]["maxAttempts"] == 3 and merged["general"]["enableAutoUpdate"] is False
    assert "hecap" not in settings_json()  # the key is never in a file


@pytest.mark.parametrize(
    "given,kept",
    [({"tools": {"exclude": ["read_many_files", "web_fetch"]}}, ["read_many_files"]), ({"tools": {"exclude": "web_fetch"}}, []), ({"tools": None}, [])],
)
def test_a_callers_exclude_list_adds_to_the_network_tools_never_lifts_them(given, kept):
    assert json.loads(settings_json(given))["tools"]["exclude"] == [*DENIED_TOOLS, *kept]


def test_argv_is_headless_stream_json_yolo_and_the_model_fits_a_path():
    argv = gemini_argv(["node", "/t/gemini.js"], model="Qwen/Qwen3-8B", instruction="do it")
    assert argv[:2] == ["node", "/t/gemini.js"] and "--prompt=do it" in argv
    assert argv[argv.index("--output-format") + 1] == "stream-json" and "--yolo" in argv and "--skip-trust" in argv
    assert argv[argv.index("--model") + 1] == "Qwen--Qwen3-8B" == model_in_path("Qwen/Qwen3-8B")


def test_a_prompt_like_a_flag_stays_a_prompt():
    for instr in ("--help me; rm -rf / $(echo 'x') \"q\"", "-", "-n two words", "mcp"):
        argv = gemini_argv(["gemini"], model="m", instruction=instr)
        assert f"--prompt={instr}" in argv
        assert shlex.split(shlex.join(argv)) == argv
