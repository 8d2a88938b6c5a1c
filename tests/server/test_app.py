"""server/app.py's front door: /capture/... goes straight to the capture proxy (it authenticates
by capture key and bounds its own bodies), with the route below /capture intact; everything else
goes to the API with its token, origin and body checks."""

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time

import httpx
import pytest

from harness_env.core.capture.asgi import route_path
from harness_env.core.capture.sockets import SOCKET_PREFIX
from harness_env.core.sandbox.lease import lease_path, own_lease, write_lease
from harness_env.server.routes.capture import capture_first
from tests.server_process import free_port


async def test_capture_calls_go_straight_to_the_proxy_with_their_route_below_capture():
    seen: list[tuple[str, str]] = []

    async def proxy(scope, receive, send):
        seen.append(("proxy", route_path(scope)))

    async def api(scope, receive, send):
        seen.append(("api", scope["path"]))

    front = capture_first(proxy, api)
    scopes = [
        {"type": "http", "path": "/capture/v1/chat/completions", "root_path": ""},
        {"type": "http", "path": "/space/capture/v1/models", "root_path": "/space"},  # a path that includes the root path
        {"type": "http", "path": "/capture/v1/models", "root_path": "/space"},  # one that does not (older servers)
        {"type": "http", "path": "/capture", "root_path": ""},  # nothing below /capture: the API's 404
        {"type": "http", "path": "/capturex/v1", "root_path": ""},
        {"type": "http", "path": "/rollout", "root_path": ""},
        {"type": "websocket", "path": "/capture/v1/x", "root_path": ""},
    ]
    for scope in scopes:
        await front(scope, None, None)
    assert seen == [
        ("proxy", "/v1/chat/completions"),
        ("proxy", "/v1/models"),
        ("proxy", "/v1/models"),
        ("api", "/capture"),
        ("api", "/capturex/v1"),
        ("api", "/rollout"),
        ("api", "/capture/v1/x"),
    ]


@pytest.mark.slow  # starts the app in processes of its own
def test_the_app_sweeps_what_a_killed_owner_left_however_it_is_started(short_tmp):
    """OpenEnv starts `harness_env.server.app:app` itself, and Ray Serve runs each replica's app's
    lifespan: the sweep is the app's, not the CLI's. A dead owner's rollout and capture socket are
    gone once the app serves; a live owner's stay."""
    sandboxes, tmp = short_tmp / "sandboxes", short_tmp / "tmp"
    sandboxes.mkdir()
    tmp.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    dead_lease = own_lease().model_copy(update={"pid": dead.pid, "start": "1"})
    rollout, kept = sandboxes / f"rollout-{os.urandom(6).hex()}", sandboxes / f"rollout-{os.urandom(6).hex()}"
    write_lease(rollout, dead_lease)
    write_lease(kept)  # this test's process: alive
    for path in (rollout, kept):
        (path / "workspace").mkdir(parents=True)
    sock = tmp / f"{SOCKET_PREFIX}{dead.pid}-0a0b0c0d.sock"
    write_lease(sock, dead_lease)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()
    port = free_port()
    env = {**os.environ, "HARNESS_ENV_SANDBOX_DIR": str(sandboxes), "TMPDIR": str(tmp), "HARNESS_ENV_DATA_DIR": str(short_tmp / "data")}
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "harness_env.server.app:app", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None and time.monotonic() < deadline, "the app did not start"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        assert sorted(os.listdir(sandboxes)) == sorted([kept.name, lease_path(kept).name])
        assert not sock.exists() and not lease_path(sock).exists()
    finally:
        server.terminate()
        _, err = server.communicate(timeout=60)
    assert f"removed rollout {rollout.name} of a dead owner" in err
    shutil.rmtree(kept)
    lease_path(kept).unlink()
