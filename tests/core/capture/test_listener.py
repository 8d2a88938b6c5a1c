"""The capture listener's connection bounds, with real Unix sockets: one peer cannot hold more
than its share (another sandbox, in a pid namespace of its own, is still served), and idle or
half-sent connections are closed after their bound."""

from __future__ import annotations

import asyncio
import sys

import pytest

from harness_env.core.capture.listener import ConnectionBounds
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.serve import serve_on_unix

PROBE = b"HEAD / HTTP/1.1\r\nhost: capture\r\n\r\n"  # a keyless route: answered 200 without a model call
# A peer in a pid namespace of its own (as a bubblewrap sandbox is), asking the same.
OTHER_PEER = [
    "unshare",
    "--pid",
    "--fork",
    sys.executable,
    "-c",
    "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
    "s.sendall(b'HEAD / HTTP/1.1\\r\\nhost: capture\\r\\n\\r\\n'); print(s.recv(200).split(b'\\r\\n')[0].decode())",
]


async def _status(path: str) -> tuple[bytes, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(PROBE)
    line = await asyncio.wait_for(reader.readline(), 30)
    return line, writer


async def _refusal(path: str) -> bytes:
    """What the listener sends a connection it refuses, at once (before any request: a request
    written into a socket being closed may only get a reset)."""
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True once the server closed the connection (EOF); fails the test if it never does."""
    while True:
        data = await asyncio.wait_for(reader.read(4096), 30)
        if not data:
            return True


@pytest.fixture
async def listener(tmp_path):
    proxy = CaptureProxy()
    bounds = ConnectionBounds(per_peer=20, total=200, header_timeout_s=0.5, idle_timeout_s=1.0)
    async with serve_on_unix(proxy.app, tmp_path / "capture.sock", bounds) as path:
        yield path, bounds
    await proxy.aclose()


async def test_one_peer_holds_at_most_its_share_and_another_is_still_served(listener):
    path, bounds = listener
    held = [await asyncio.open_unix_connection(path) for _ in range(bounds.per_peer)]  # idle: nothing sent
    for _ in range(50):  # beyond its share: each told why, and closed
        answer = await _refusal(path)
        assert answer.startswith(b"HTTP/1.1 503") and b"holds 20 connections to the capture proxy already" in answer
    other = await asyncio.create_subprocess_exec(*OTHER_PEER, path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(other.communicate(), 60)
    assert out.decode().strip() == "HTTP/1.1 200 OK", err.decode()
    for _, writer in held:
        writer.close()
    await asyncio.sleep(0.2)
    line, writer = await _status(path)  # its share is back once it let go
    assert line.startswith(b"HTTP/1.1 200")
    writer.close()


async def test_the_total_is_bounded_whoever_connects(tmp_path):
    proxy = CaptureProxy()
    bounds = ConnectionBounds(per_peer=100, total=10)
    async with serve_on_unix(proxy.app, tmp_path / "capture.sock", bounds) as path:
        held = [await asyncio.open_unix_connection(path) for _ in range(10)]
        answer = await _refusal(path)
        assert answer.startswith(b"HTTP/1.1 503") and b"holds 10 connections already" in answer
        for _, w in held:
            w.close()
    await proxy.aclose()


async def test_idle_and_half_sent_connections_are_closed_after_their_bound(listener):
    path, bounds = listener
    silent = await asyncio.open_unix_connection(path)  # connects, sends nothing
    half = await asyncio.open_unix_connection(path)  # sends part of a request's head, never the rest
    half[1].write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: capture\r\n")
    served = await asyncio.open_unix_connection(path)  # one request, then idle; then half of a second
    served[1].write(PROBE)
    assert (await asyncio.wait_for(served[0].readuntil(b"\r\n\r\n"), 30)).startswith(b"HTTP/1.1 200")
    served[1].write(b"HEAD / HTTP/1.1\r\n")
    for reader, _ in (silent, half, served):
        assert await _closed_by_server(reader)
    line, writer = await _status(path)  # and the listener still answers
    assert line.startswith(b"HTTP/1.1 200")
    writer.close()


async def test_the_listeners_of_one_process_share_one_total(tmp_path, monkeypatch):
    """rollout.py serves the proxy on loopback and on a Unix socket at once: each with a total of
    its own, together they would hold twice the process's share of descriptors."""
    from harness_env.core.capture.listener import process_bounds
    from harness_env.core.capture.serve import serve_on_loopback

    proxy = CaptureProxy()
    shared = process_bounds()
    async with serve_on_loopback(proxy.app) as url, serve_on_unix(proxy.app, tmp_path / "capture.sock") as path:
        monkeypatch.setattr(shared, "total", sum(shared.held.values()) + 1)
        host, port = url.removeprefix("http://").split(":")
        over_tcp = await asyncio.open_connection(host, int(port))
        over_tcp[1].write(PROBE)
        assert (await asyncio.wait_for(over_tcp[0].readline(), 30)).startswith(b"HTTP/1.1 200")
        answer = await _refusal(path)  # the other listener: the process's total is reached
        assert answer.startswith(b"HTTP/1.1 503") and b"connections already" in answer
        over_tcp[1].close()
    await proxy.aclose()
