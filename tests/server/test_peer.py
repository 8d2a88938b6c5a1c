"""An agent on the host's network (network "open") guessing tokens at the server slows itself,
never the trainer on the same host: both come from 127.0.0.1, the limiter tells them apart by the
mount namespace of the process at the other end (server/peer.py). Real bubblewrap sandboxes, a real
uvicorn on loopback."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi import FastAPI

from harness_env.core.sandbox.local import create_local_sandbox
from harness_env.server.auth import AuthFailureLimiter, TokenAuth
from harness_env.server.peer import peer_key
from tests import needs
from tests.fakes.loopback import LoopbackServer

TOKEN = "the-trainers-token"
GUESSES = 6

# Run inside the sandbox by the system Python: wrong tokens, one after another; the statuses printed.
GUESSER = """
import json, sys, urllib.request, urllib.error
out = []
for i in range(int(sys.argv[2])):
    req = urllib.request.Request(sys.argv[1] + "/harnesses", headers={"Authorization": f"Bearer guess-{sys.argv[3]}-{i}"})
    try:
        out.append(urllib.request.urlopen(req, timeout=20).status)
    except urllib.error.HTTPError as e:
        out.append(e.code)
print(json.dumps(out))
"""


@pytest.fixture
def server():
    inner = FastAPI()

    @inner.get("/harnesses")
    async def harnesses():
        return []

    limiter = AuthFailureLimiter(max_failures=3, window_s=60, backoff_s=60, slow_interval_s=30)
    with LoopbackServer(TokenAuth(inner, TOKEN, own_origins=[], limiter=limiter)) as srv:
        yield srv, limiter


async def _guess_from_a_sandbox(url: str, tag: str) -> list[int]:
    sandbox = create_local_sandbox(use_bwrap=True, ro_paths=[])  # no capture socket: the host's network
    try:
        assert sandbox.backend == "bwrap"
        done = await sandbox.exec(["/usr/bin/python3", "-c", GUESSER, url, str(GUESSES), tag], timeout=120)
        assert done.exit_code == 0, done
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        await sandbox.close()


async def test_a_sandboxed_agent_guessing_tokens_slows_itself_not_the_trainer(server):
    needs.bwrap()
    srv, limiter = server
    url = f"http://127.0.0.1:{srv.port}"
    statuses = await _guess_from_a_sandbox(url, "a")
    assert statuses[:3] == [401, 401, 401] and set(statuses[3:]) == {429}, statuses  # the agent is slowed
    assert limiter.slowing("127.0.0.1")
    async with httpx.AsyncClient(base_url=url) as trainer:
        # The trainer beside it, same address: its token is checked at once, and a wrong one is
        # its own first failure, not the agent's seventh.
        assert (await trainer.get("/harnesses", headers={"authorization": f"Bearer {TOKEN}"})).status_code == 200
        assert (await trainer.get("/harnesses", headers={"authorization": "Bearer stale"})).status_code == 401
        assert (await trainer.get("/harnesses", headers={"authorization": f"Bearer {TOKEN}"})).status_code == 200
    # Another sandbox is apart from the first one too: the first's guessing does not slow it.
    other = await _guess_from_a_sandbox(url, "b")
    assert other[:3] == [401, 401, 401], other


async def test_guessing_from_the_host_still_slows_the_address(server):
    """What is not a sandbox is keyed by its address as before: a host process guessing is slowed."""
    srv, _ = server
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{srv.port}") as c:
        statuses = [(await c.get("/harnesses", headers={"authorization": f"Bearer guess-{i}"})).status_code for i in range(5)]
    assert statuses == [401, 401, 401, 429, 429]


def test_a_peer_that_is_no_local_process_is_keyed_by_its_address():
    scope = {"client": ("10.1.2.3", 40000), "server": ("10.1.2.4", 8100)}
    assert peer_key(scope, "10.1.2.3") == "10.1.2.3"
    # a loopback address whose connection is not in /proc (a forwarded or gone one): the address
    assert peer_key({"client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}, "127.0.0.1") == "127.0.0.1"
