"""`harness-env serve` as a user starts it: where it says to go, and what changes on a Hugging Face Space."""

import json
import resource
import subprocess
import sys

import httpx
import pytest

from harness_env.client import HarnessEnv
from harness_env.server.main import default_public_url, where_to_go

pytestmark = pytest.mark.slow  # starts the server process: not in the fast tier


def test_the_public_url_is_the_space_s_on_a_space_else_loopback():
    assert default_public_url(8100, {}) == "http://127.0.0.1:8100"
    assert default_public_url(7860, {"SPACE_HOST": "me-harness-env.hf.space", "SPACE_ID": "me/harness-env"}) == "https://me-harness-env.hf.space"


def test_serve_says_where_its_faces_are():
    lines = where_to_go("0.0.0.0", 8100, None)
    for face in ("http://127.0.0.1:8100/web", "http://127.0.0.1:8100/mcp", "http://127.0.0.1:8100/docs", "http://127.0.0.1:8100/health"):
        assert face in lines, face
    assert "https://me.hf.space/web" in where_to_go("0.0.0.0", 7860, "https://me.hf.space/")


@pytest.mark.e2e
def test_a_server_on_a_space_serves_its_public_origin_and_runs_rollouts_over_loopback(start_server, policy_server):
    """On a Space, the Space's https address is the server's own origin (a browser on the Space's
    page is not refused) and the address it prints; its own rollouts still reach the capture proxy
    locally (a private Space's front door would refuse their keys)."""
    space = {"SPACE_ID": "me/harness-env", "SPACE_HOST": "me-harness-env.hf.space", "HARNESS_ENV_PUBLIC_URL": ""}
    server = start_server("--token", "tok", env=space)
    auth = {"authorization": "Bearer tok"}
    assert httpx.get(server.url + "/harnesses", headers={**auth, "origin": "https://me-harness-env.hf.space"}).status_code == 200
    assert httpx.get(server.url + "/harnesses", headers={**auth, "origin": "https://evil.example"}).status_code == 403
    policy_server.policy.scripts["m"] = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]
    with HarnessEnv(server.url, token="tok") as env:
        result = env.run_rollout(
            harness="whitebox", base_url=policy_server.base_url, model="m", instruction="Create hello.txt.", verify=["grep -qx hello hello.txt"]
        )
    assert result.error is None and result.reward == 1.0, result.error
    assert len(result.proxy_turns) == 2
    printed = server.log_path.read_text()  # printed at start
    assert "web UI     https://me-harness-env.hf.space/web" in printed


@pytest.mark.e2e
def test_serve_prints_its_start_and_stop_lines_once(start_server):
    """The capture proxy's own listeners are uvicorn servers inside the app's: their start and
    stop lines must not repeat the server's."""
    server = start_server(env={"HARNESS_ENV_LOG_LEVEL": "info"})
    assert httpx.get(server.url + "/health").status_code == 200
    printed = server.stop()
    for line in ("serving on", "Started server process", "Application startup complete", "Shutting down", "Finished server process"):
        assert printed.count(line) == 1, (line, printed)


def test_serve_raises_the_open_files_limit_to_the_hard_one() -> None:
    """A soft limit of 256 would refuse sockets and pipes at about a dozen rollouts."""
    code = (
        "import resource, json; soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)); "
        "from harness_env.server.main import raise_open_files_limit; note = raise_open_files_limit(); "
        "print(json.dumps([note, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    note, soft, hard = json.loads(out)
    assert soft == hard or (hard == resource.RLIM_INFINITY and soft >= 16384)
    assert (note is None) == (soft >= 16384)
