"""Client behaviour that needs no server."""

import sys

import httpx
import pytest

from harness_env.client import AsyncHarnessEnv, HarnessEnv, http


async def test_connection_errors_are_retried_with_backoff_then_raised(monkeypatch):
    sleeps: list[float] = []

    async def fake_sleep(s):
        sleeps.append(s)

    monkeypatch.setattr(http.asyncio, "sleep", fake_sleep)
    async with AsyncHarnessEnv("http://127.0.0.1:9") as env:
        with pytest.raises(httpx.ConnectError):
            await env.health()
    assert sleeps == [0.5, 1.0, 2.0, 4.0]


def test_arguments_are_checked_locally_before_any_call():
    with HarnessEnv("http://127.0.0.1:9") as env, pytest.raises(Exception, match="max_turns"):
        env.run_rollout(instruction="x", base_url="http://h/v1", model="m", max_turns=0)


def test_client_imports_no_server_code():
    import subprocess

    code = (
        "import sys, harness_env.client; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('fastapi', 'aiohttp', 'uvicorn', 'mcp', 'starlette') "
        "or m.startswith(('harness_env.server', 'harness_env.core', 'harness_env.envs'))]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_private_space_gets_the_stored_hugging_face_token_and_no_other_host_does(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_stored")  # what huggingface_hub's get_token() reads first
    space = http.auth_headers("https://someone-harness-env.hf.space", "tok", None, None)
    assert space == {"authorization": "Bearer hf_stored", "x-harness-env-token": "tok"}
    # Any other address: the Hugging Face token is never sent, the server's token is the bearer.
    for url in ("http://127.0.0.1:8100", "https://hf.space.attacker.example", "https://evil-hf.space.example"):
        assert http.auth_headers(url, "tok", None, None) == {"authorization": "Bearer tok"}
    assert http.auth_headers("https://x.hf.space", "tok", "", None) == {"authorization": "Bearer tok"}  # "": no HF token
    assert http.auth_headers("http://h", None, "hf_given", {"X-Trace": "1"}) == {"authorization": "Bearer hf_given", "x-trace": "1"}
    with HarnessEnv("https://someone-harness-env.hf.space", token="tok", headers={"x-extra": "1"}) as env:
        sent = env._clients[env.base_url].headers
        assert sent["authorization"] == "Bearer hf_stored" and sent["x-harness-env-token"] == "tok" and sent["x-extra"] == "1"
    # Several servers: the same token for each, the Hugging Face token to the Space address only.
    with HarnessEnv(base_urls=["https://someone-harness-env.hf.space", "http://127.0.0.1:8100"], token="tok") as env:
        space, plain = (env._clients[url].headers for url in env.base_urls)
        assert space["authorization"] == "Bearer hf_stored" and space["x-harness-env-token"] == "tok"
        assert plain["authorization"] == "Bearer tok" and "x-harness-env-token" not in plain
