"""The in-sandbox capture socket of a real `harness-env serve` under a flood of idle connections
(as an agent opens them through its sandbox's socat): the server holds only a bounded share of
them, still answers /health, and another rollout's capture works."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest

from harness_env.core.capture.listener import PER_PEER
from tests.fakes.policy import hello_rollout
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e
FLOOD = 3000


def _capture_socket(server: ServerProcess) -> Path:
    [path] = server.tmp_dir.glob("harness-env-capture-*.sock")
    return path


def _still_open(s: socket.socket) -> bool:
    """The server has not closed (or refused) this connection."""
    try:
        s.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)  # the refusal, or EOF
    except BlockingIOError:
        return True
    except ConnectionResetError:
        pass
    return False


def test_a_flood_of_idle_connections_does_not_starve_the_server(start_server, policy_server) -> None:
    server = start_server()
    path = _capture_socket(server)
    flood: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(path))  # blocking: waits while the server's backlog is full
            flood.append(s)
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        deadline = time.monotonic() + 60  # connections still in the listen backlog are not accepted yet
        while len(held := [s for s in flood if _still_open(s)]) > PER_PEER and time.monotonic() < deadline:
            time.sleep(0.2)
        assert 0 < len(held) <= PER_PEER  # the rest were told why and closed
        refused = next(s for s in flood if s not in held)
        assert b"connections to the capture proxy already" in refused.recv(4096)

        r = httpx.post(server.url + "/rollout", timeout=120, json=hello_rollout(policy_server, "flood"))
        assert r.status_code == 200, r.text
        result = r.json()
        assert result["error"] is None and result["reward"] == 1.0
        assert "network 'proxy_only'" not in " ".join(result["sandbox_notes"])  # it went through the socket
        assert result["proxy_turns"] and result["capture_level"] == "tokens"
    finally:
        for s in flood:
            s.close()
    server.assert_no_rollout_left()
