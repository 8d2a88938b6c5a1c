"""The capture proxy served on a Unix socket: what a sandbox with its own network namespace reaches."""

import asyncio
import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

import httpx
import pytest

from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.serve import serve_on_unix
from harness_env.models import Endpoint
from tests.fakes.policy import FakePolicy, FakePolicyServer

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # the venv's interpreter lives under /root, out of reach of other uids
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


@pytest.fixture
def socket_dir():
    """A directory any uid may traverse (pytest's tmp_path is root-only), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="he-uds-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _client(path: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=path), base_url="http://proxy", timeout=30)


async def test_proxy_routes_and_only_them_over_a_unix_socket(socket_dir):
    proxy = CaptureProxy()
    policy = FakePolicy(scripts={"m": [{"text": "hello"}]})
    sock_path = socket_dir / "capture.sock"
    with FakePolicyServer(policy) as upstream:
        async with serve_on_unix(proxy.app, sock_path) as path:
            assert path == str(sock_path)
            st = os.lstat(path)
            assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
            async with _client(path) as client:
                assert (await client.get("/v1/models", headers={"authorization": "Bearer nope"})).status_code == 401
                r = await client.post("/v1/chat/completions", json={"messages": [], "tools": TOOLS})
                assert r.status_code == 401 and policy.requests == []
                # The server's own API is not there: the socket serves the proxy app alone.
                for route in ("/health", "/rollout", "/mcp", "/web"):
                    assert (await client.get(route)).status_code == 404
                session = proxy.open_session(Endpoint(base_url=upstream.base_url, api_key="sk-upstream-key-0001", model="m"), CapturePolicy())
                body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
                r = await client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {session.key}"})
                assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hello"
                assert len(session.turns) == 1
        await proxy.aclose()
    assert not sock_path.exists()  # removed at exit


@pytest.mark.skipif(os.geteuid() != 0, reason="connecting as another uid needs root to switch uid")
async def test_an_unprivileged_uid_can_connect(socket_dir):
    assert os.path.exists(SYSTEM_PYTHON), f"{SYSTEM_PYTHON} is needed to connect as uid {NOBODY}: apt-get install python3"
    script = (
        "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]);"
        "s.sendall(b'GET /v1/models HTTP/1.1\\r\\nHost: p\\r\\nAuthorization: Bearer nope\\r\\nConnection: close\\r\\n\\r\\n');"
        "print(s.recv(4096).split(b'\\r\\n')[0].decode())"
    )
    async with serve_on_unix(CaptureProxy().app, socket_dir / "capture.sock") as path:
        proc = await asyncio.create_subprocess_exec(
            SYSTEM_PYTHON, "-c", script, path, user=NOBODY, group=NOBODY, extra_groups=[], stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == "HTTP/1.1 401 Unauthorized"


async def test_a_stale_socket_is_replaced_and_anything_else_is_not(socket_dir):
    stale = socket_dir / "stale.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(stale))
    dead.close()  # the file stays, nobody listens: as after a crash
    async with serve_on_unix(CaptureProxy().app, stale) as path:
        async with _client(path) as client:
            assert (await client.get("/v1/models")).status_code == 401
        with pytest.raises(FileExistsError):  # a live socket is never taken over
            async with serve_on_unix(CaptureProxy().app, stale):
                pass
        assert stale.exists()
    assert not stale.exists()
    plain = socket_dir / "file"
    plain.write_text("keep me")
    with pytest.raises(FileExistsError):
        async with serve_on_unix(CaptureProxy().app, plain):
            pass
    assert plain.read_text() == "keep me"
    with pytest.raises(ValueError, match="over 107 bytes"):
        async with serve_on_unix(CaptureProxy().app, socket_dir / ("x" * 120)):
            pass
