"""The processes bench/proxy.py measures, each in a process of its own: the modelled upstream, the
capture proxy (this tree's or an earlier commit's), a bare relay on the same stack, a kernel relay
(socat), and OpenEnv's capture server (OpenEnv 0.10.0 from its own venv, tests/openenv_env.py).
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import socket
import subprocess
import sys
import tarfile
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
TURNS_PER_ROLLOUT = 40  # a session's turns are dropped after this many, as if its rollout ended

Target = tuple[str, list[str], str, int | None]  # base URL, keys (round robin), dialect, pid whose CPU is counted

UPSTREAM = r'''
import asyncio, functools, json, sys, uvicorn

@functools.lru_cache(maxsize=None)
def answers(n_ids):
    """The whole answer and the first stream chunk, with `n_ids` prompt token ids (made once)."""
    ids = list(range(1000, 1000 + n_ids))
    dumps = functools.partial(json.dumps, separators=(",", ":"))  # compact, as vLLM writes its answers and chunks
    body = dumps({"id": "x", "object": "chat.completion", "prompt_token_ids": ids,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello world"}, "finish_reason": "stop",
        "token_ids": [1, 2], "logprobs": {"content": [{"token": "hello", "logprob": -0.1}, {"token": " world", "logprob": -0.2}]}}]}).encode()
    first = ("data: " + dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "prompt_token_ids": ids}) + "\n\n").encode()
    return body, first

CHUNK = ("data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "tok "}, "token_ids": [7],
    "logprobs": {"content": [{"token": "tok ", "logprob": -0.5}]}}]}, separators=(",", ":")) + "\n\n").encode()
LAST = b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    if not body:  # readiness probe
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    req = json.loads(body)
    # The modelled engine (prefill ms, chunks, ms between chunks, prompt ids), on the first line
    # of the last message: what every dialect passes on to the engine.
    ttft, chunks, gap, n_ids = json.loads(req["messages"][-1]["content"].split("\n", 1)[0])
    BODY, FIRST = answers(n_ids)
    if not req.get("stream"):
        if ttft or gap:
            await asyncio.sleep((ttft + chunks * gap) / 1000)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": BODY})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    if ttft:
        await asyncio.sleep(ttft / 1000)
    await send({"type": "http.response.body", "body": FIRST, "more_body": True})
    for _ in range(chunks):
        if gap:
            await asyncio.sleep(gap / 1000)
        await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
    await send({"type": "http.response.body", "body": LAST})

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", access_log=False)
'''

PROXY = r"""
import asyncio, contextlib, cProfile, signal, sys, time, uvicorn
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.models import Endpoint

TURNS_PER_ROLLOUT = @TURNS@

def clear_after(box):
    # Every turn is recorded; a session's turns are dropped once it has TURNS_PER_ROLLOUT, as if its
    # rollout had ended and a new one begun, so memory stays what 64 rollouts in flight hold.
    def on_turn(turn):
        if len(box[0].turns) >= TURNS_PER_ROLLOUT:
            box[0].turns.clear()
    return on_turn

async def main():
    proxy = CaptureProxy()
    keys = []
    for _ in range(int(sys.argv[3])):
        box = []
        box.append(proxy.open_session(Endpoint(base_url=sys.argv[2], api_key="sk-bench", model=sys.argv[4]), CapturePolicy(top_logprobs=0),
                                      on_turn=clear_after(box)))
        keys.append(box[0].key)
    print(" ".join(keys), flush=True)
    cfg = uvicorn.Config(proxy.app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", access_log=False, lifespan="off")
    server = Server(cfg)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: setattr(server, "should_exit", True))
    profile = cProfile.Profile(time.process_time) if len(sys.argv) > 5 else None  # CPU time: wall time would count the upstream running while a write wakes it
    if profile is not None:  # --profile: cProfile of the whole proxy process, written when it stops
        profile.enable()
    try:
        await server.serve()
    finally:
        if profile is not None:
            profile.disable()
            profile.dump_stats(sys.argv[5])
        await proxy.aclose()

class Server(uvicorn.Server):  # stops on SIGTERM without re-raising it, so the proxy closes and the profile is written
    capture_signals = contextlib.nullcontext

import uvloop  # as under `harness-env serve` (uvicorn picks uvloop when installed)
uvloop.run(main())
""".replace("@TURNS@", str(TURNS_PER_ROLLOUT))

BARE_RELAY = r"""
# The floor for a relay on the proxy's stack (uvicorn + uvloop + aiohttp): bytes in, bytes out,
# nothing parsed, rewritten, masked or recorded. Only for measuring.
import asyncio, sys, aiohttp, uvicorn

async def main():
    client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024), auto_decompress=False, skip_auto_headers=("User-Agent",))
    upstream = sys.argv[2]

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            m = await receive()
            chunks.append(m.get("body", b""))
            if not m.get("more_body"):
                break
        path = scope["path"][len("/v1"):] if scope["path"].startswith("/v1") else scope["path"]
        if not chunks[0]:  # readiness probe
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        async with client.post(upstream + path, data=b"".join(chunks), headers={"content-type": "application/json", "authorization": "Bearer sk-bench"}) as r:
            await send({"type": "http.response.start", "status": r.status, "headers": [(b"content-type", r.headers.get("content-type", "").encode())]})
            async for piece in r.content.iter_any():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    print("bare", flush=True)
    cfg = uvicorn.Config(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", access_log=False, lifespan="off")
    await uvicorn.Server(cfg).serve()

import uvloop
uvloop.run(main())
"""

# OpenEnv's capture server (openenv.core.harness.capture.server.create_app), served by uvicorn as its
# own `main` serves it (uvicorn.run; OpenEnv's venv has no uvloop), minus the per-request access
# log. Sessions are registered as a trainer registers them; like the proxy's, a session's graph is
# started afresh after TURNS_PER_ROLLOUT turns.
OPENENV = r"""
import sys, uvicorn
from openenv.core.harness.capture import graph
from openenv.core.harness.capture.server import create_app

add_turn = graph.RolloutGraph.add_turn
def bounded_add_turn(self, node):
    if len(self._order) >= @TURNS@:
        self.__init__()
    return add_turn(self, node)
graph.RolloutGraph.add_turn = bounded_add_turn

app = create_app(llm_url=sys.argv[2], model=sys.argv[4], api_key="sk-bench", capture_level="tokens")
keys = [app.state.registry.create().session_id for _ in range(int(sys.argv[3]))]
print(" ".join(keys), flush=True)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", access_log=False)
""".replace("@TURNS@", str(TURNS_PER_ROLLOUT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_up(url: str) -> None:
    async with aiohttp.ClientSession() as c:
        for _ in range(200):
            try:
                async with c.get(url):
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


def baseline_tree(rev: str, into: str) -> str:
    """The package as of `rev` (git archive), importable from `into` as harness_env."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--prefix=harness_env/", rev], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def start_upstream(procs: list[subprocess.Popen]) -> str:
    """The modelled engine; its base URL (procs[-1] is its process)."""
    port = free_port()
    procs.append(subprocess.Popen([sys.executable, "-c", UPSTREAM, str(port)]))
    return f"http://127.0.0.1:{port}/v1"


async def _started(procs: list[subprocess.Popen], argv: list[str], env: dict[str, str]) -> tuple[str, list[str], int]:
    """Start `argv` with its port as its first argument; its base URL, the keys it prints, its pid."""
    port = free_port()
    px = subprocess.Popen([argv[0], argv[1], argv[2], str(port), *argv[3:]], env=env, stdout=subprocess.PIPE, text=True)
    procs.append(px)
    keys = px.stdout.readline().split()  # type: ignore[union-attr]
    await wait_up(f"http://127.0.0.1:{port}/")
    return f"http://127.0.0.1:{port}/v1", keys, px.pid


async def start_proxy(procs: list[subprocess.Popen], tree: str, upstream: str, sessions: int, model: str, profile: list[str]) -> Target:
    """The capture proxy (transparent_proxy, `sessions` open) of the package in `tree`, relaying to `upstream`."""
    env = {**os.environ, "PYTHONPATH": tree}
    url, keys, pid = await _started(procs, [sys.executable, "-c", PROXY, upstream, str(sessions), model, *profile], env)
    return (url, keys, "chat", pid)


async def start_bare_relay(procs: list[subprocess.Popen], upstream: str, sessions: int) -> Target:
    url, _, pid = await _started(procs, [sys.executable, "-c", BARE_RELAY, upstream], dict(os.environ))
    return (url, ["-"] * sessions, "chat", pid)


async def start_kernel_relay(procs: list[subprocess.Popen], upstream: str, sessions: int) -> Target:
    """socat relaying TCP bytes to the upstream (a process per connection, nothing in Python): the
    floor any relay has on this machine, the kernel's loopback and a process switch each way."""
    if shutil.which("socat") is None:
        raise SystemExit("--kernel-relay needs socat (./dev installs it)")
    port, up = free_port(), urlsplit(upstream)
    procs.append(subprocess.Popen(["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,backlog=256,nodelay", f"TCP:{up.hostname}:{up.port},nodelay"]))
    await wait_up(f"http://127.0.0.1:{port}/")
    return (f"http://127.0.0.1:{port}/v1", ["-"] * sessions, "chat", None)  # its CPU is its children's, not counted


async def start_openenv(procs: list[subprocess.Popen], upstream: str, sessions: int, model: str) -> Target:
    """OpenEnv's capture server with `sessions` registered, from OpenEnv's own venv."""
    sys.path.insert(0, str(ROOT))
    from tests import openenv_env

    if not openenv_env.installed():
        raise SystemExit(f"--openenv needs OpenEnv's venv: {openenv_env.INSTALL_HINT}")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    url, keys, pid = await _started(procs, [str(openenv_env.python()), "-c", OPENENV, upstream, str(sessions), model], env)
    return (url, keys, "chat", pid)
