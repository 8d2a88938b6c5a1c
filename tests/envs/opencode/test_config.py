import json

from harness_env.envs.opencode.config import DISABLED_TOOLS, PROVIDER, opencode_argv, opencode_env, opencode_json


def test_provider_points_at_the_proxy_with_the_session_key():
    cfg = json.loads(opencode_json(proxy_base_url="http://127.0.0.1:7/v1", session_key="hecap-k", model="Qwen/Q", max_tokens=256))
    p = cfg["provider"][PROVIDER]
    assert p["npm"] == "@ai-sdk/openai-compatible"
    assert p["options"] == {"baseURL": "http://127.0.0.1:7/v1", "apiKey": "hecap-k"}
    assert p["models"]["Qwen/Q"]["limit"]["output"] == 256
    assert cfg["model"] == f"{PROVIDER}/Qwen/Q"
    assert cfg["permission"]["bash"] == "allow" and cfg["permission"]["edit"] == "allow"
    assert all(cfg["tools"][t] is False for t in DISABLED_TOOLS) and "webfetch" in DISABLED_TOOLS and "question" in DISABLED_TOOLS
    assert cfg["autoupdate"] is False


def test_user_config_is_deep_merged_last():
    extra = {"permission": {"bash": "ask"}, "tools": {"todowrite": False}, "provider": {PROVIDER: {"options": {"timeout": 5}}}}
    cfg = json.loads(opencode_json(proxy_base_url="u", session_key="k", model="m", extra=extra))
    assert cfg["permission"] == {**cfg["permission"], "bash": "ask"} and cfg["permission"]["edit"] == "allow"
    assert cfg["tools"]["todowrite"] is False and cfg["tools"]["webfetch"] is False
    assert cfg["provider"][PROVIDER]["options"] == {"baseURL": "u", "apiKey": "k", "timeout": 5}


def test_offline_environment():
    env = opencode_env("/h/cfg.json")
    assert env["OPENCODE_CONFIG"] == "/h/cfg.json" and env["OPENCODE_DISABLE_MODELS_FETCH"] == "1" and env["OPENCODE_DISABLE_AUTOUPDATE"] == "1"


def test_argv_is_json_run_with_no_message_argument():
    # The message goes on stdin (OpenCode quotes a message argument holding a space).
    argv = opencode_argv(["/t/opencode"], model="m")
    assert argv == ["/t/opencode", "run", "--format", "json", "--pure", "--model", f"{PROVIDER}/m"]
