"""Attacks on a real `harness-env serve` (issue 18, server side), each performed for real and
required to fail safely: no key leaves for a host it does not belong to, no body over the limit is
buffered, no input gives a 500 or a traceback, a client that goes away stops its rollout, and the
token is neither crashable, guessable at speed, logged, nor usable from another origin."""

import json
import socket
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from websockets.sync.client import connect as ws_connect

from harness_env.server.auth import WEB_COOKIE, web_session_value
from tests.fakes.loopback import LoopbackServer
from tests.server_process import ServerProcess, raw_status

pytestmark = pytest.mark.e2e

CATALOG_KEYS = {"OPENAI_API_KEY": "sk-catalog-openai-7f3a", "HF_ROUTER_API_KEY": "hf-catalog-router-91c2", "VLLM_API_KEY": "vllm-catalog-key-5d1e"}
TOKEN = "tok-Hq7Lp2Zx9Wv4"
MB = 1 << 20


class Recorder:
    """An HTTP listener that records the Authorization header of every request and refuses it."""

    def __init__(self) -> None:
        self.seen: list[str] = []

        async def any_path(request: Request) -> JSONResponse:
            self.seen.append(request.headers.get("authorization", ""))
            return JSONResponse({"error": {"message": "no"}}, status_code=401)

        self.app = Starlette(routes=[Route("/{path:path}", any_path, methods=["GET", "POST", "PUT", "DELETE"])])


@pytest.fixture(scope="module")
def own_endpoint():
    """Where the catalog's entries point: the only host their keys may go to."""
    rec = Recorder()
    with LoopbackServer(rec.app) as srv:
        srv.recorder = rec
        yield srv


@pytest.fixture
def attacker():
    rec = Recorder()
    with LoopbackServer(rec.app) as srv:
        srv.recorder = rec
        srv.base_url = f"http://localhost:{srv.port}/v1"  # another name than the catalog's 127.0.0.1
        yield srv


@pytest.fixture(scope="module")
def open_server(tmp_path_factory, own_endpoint):
    """No token (the default on loopback), the three catalog entries configured with keys."""
    env = {
        **CATALOG_KEYS,
        "OPENAI_BASE_URL": own_endpoint.base_url,
        "OPENAI_MODEL": "m",
        "HF_ROUTER_BASE_URL": own_endpoint.base_url,
        "HF_ROUTER_MODEL": "m",
        "VLLM_URL": own_endpoint.base_url,
        "VLLM_MODEL": "m",
    }
    server = ServerProcess(tmp_path_factory.mktemp("hardening-open"), "--max-concurrent", "4", env=env)
    yield server
    out = server.stop()
    assert "Traceback" not in out, out[-3000:]


@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    """A token, and uvicorn's request lines in the log (to look for the token there)."""
    server = ServerProcess(tmp_path_factory.mktemp("hardening-token"), "--token", TOKEN, env={"HARNESS_ENV_LOG_LEVEL": "info"})
    yield server
    out = server.stop()
    assert "Traceback" not in out, out[-3000:]
    assert TOKEN not in out


def _log(server: ServerProcess) -> str:
    return server.log_path.read_text()


def _rpc(name: str, arguments: dict, rid: int = 1) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


def _post_rpc(server: ServerProcess, body, timeout: float = 60) -> httpx.Response:
    return httpx.post(server.url + "/mcp", json=body, headers={"accept": "*/*"}, timeout=timeout)


def _from(address: str) -> httpx.Client:
    """A client whose connections come from `address` (any 127.x.y.z is this machine)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30)


def _ws_handshake(server: ServerProcess, target: bytes, source: str = "127.0.0.1", extra: bytes = b"") -> int:
    """The HTTP status a WebSocket upgrade of `target` gets (101 when accepted)."""
    return raw_status(
        server.port,
        b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1:" + str(server.port).encode() + b"\r\n"
        b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n" + extra + b"\r\n",
        timeout=15,
        source=source,
    )


def _rss_mb(server: ServerProcess) -> int:
    for line in open(f"/proc/{server.proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS")


def _no_leak(text: str, server: ServerProcess) -> None:
    """An answer shows neither a traceback nor where the server's files are."""
    assert "Traceback" not in text and 'File "' not in text, text
    assert str(server.sandbox_dir.parent) not in text and "/site-packages/" not in text and "/work/" not in text, text


# -- 6: catalog keys go only to their own URL ----------------------------------------------------
@pytest.mark.parametrize("endpoint,key_var", [("openai", "OPENAI_API_KEY"), ("hf_router", "HF_ROUTER_API_KEY"), ("vllm", "VLLM_API_KEY")])
def test_a_catalog_key_never_goes_to_a_callers_base_url(open_server, attacker, endpoint, key_var):
    args = {"instruction": "x", "endpoint": endpoint, "base_url": attacker.base_url, "model": "m", "harness": "whitebox", "agent_timeout_s": 30}
    r = httpx.post(open_server.url + "/rollout", json=args, timeout=60)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert key_var in detail and "drop base_url" in detail and "api_key" in detail
    rpc = _post_rpc(open_server, _rpc("run_rollout", args)).json()
    assert key_var in rpc["error"]["message"]
    assert attacker.recorder.seen == []
    assert CATALOG_KEYS[key_var] not in r.text + json.dumps(rpc)


def test_an_explicit_key_may_go_to_an_explicit_base_url_and_the_catalog_key_to_its_own(open_server, attacker, own_endpoint):
    # The listeners do record: the caller's own key reaches the caller's host ...
    args = {
        "instruction": "x",
        "endpoint": "openai",
        "base_url": attacker.base_url,
        "api_key": "caller-key",
        "model": "m",
        "harness": "whitebox",
        "agent_timeout_s": 30,
    }
    result = httpx.post(open_server.url + "/rollout", json=args, timeout=120).json()
    assert result["error"] and result["reward"] is None, result
    assert attacker.recorder.seen and set(attacker.recorder.seen) == {"Bearer caller-key"}
    # ... and the catalog key its own URL, also when the caller names that URL (in another spelling).
    own_endpoint.recorder.seen.clear()
    for base_url in ("", own_endpoint.base_url.removesuffix("/v1")):
        args = {"instruction": "x", "endpoint": "openai", "base_url": base_url, "harness": "whitebox", "agent_timeout_s": 30}
        result = httpx.post(open_server.url + "/rollout", json=args, timeout=120).json()
        assert result["error"] and result["reward"] is None, result
        assert CATALOG_KEYS["OPENAI_API_KEY"] not in json.dumps(result)
    assert set(own_endpoint.recorder.seen) == {f"Bearer {CATALOG_KEYS['OPENAI_API_KEY']}"}
    open_server.assert_no_rollout_left()


# -- 9: the body limit holds for chunked bodies; errors never echo the body -------------------------
def _chunks(total_mb: int, sent: list[int]):
    chunk = b"x" * MB
    for _ in range(total_mb):
        sent[0] += len(chunk)
        yield chunk


@pytest.mark.parametrize("path", ["/rollout", "/mcp", "/catalog"])
def test_a_chunked_300_mb_body_is_cut_off_at_the_limit(open_server, path):
    before = _rss_mb(open_server)
    sent = [0]
    r = httpx.post(open_server.url + path, content=_chunks(300, sent), headers={"content-type": "application/json"}, timeout=120)
    if path == "/catalog":  # a GET route: never reads the body (405), and buffers none of it
        assert r.status_code == 405
    else:
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "request_too_large"
        assert sent[0] < 100 * MB, f"the server read {sent[0] // MB} MB before refusing"
    assert _rss_mb(open_server) - before < 100
    assert httpx.get(open_server.url + "/health").status_code == 200


def test_validation_errors_do_not_echo_the_body(open_server):
    marker = "ECHO-MARKER-" * 20_000  # 240 kB
    for body in ({"instruction": marker, "max_turns": "many"}, {"instruction": "x", "files": {"a": marker}, "harness": ["not", marker]}):
        r = httpx.post(open_server.url + "/rollout", json=body, timeout=30)
        assert r.status_code == 422 and "ECHO-MARKER" not in r.text and len(r.content) < 5000, r.text[:500]
    r = httpx.post(open_server.url + "/rollout", content=b'{"instruction": "' + b"ECHO-MARKER" * 1000 + b'"', headers={"content-type": "application/json"})
    assert r.status_code == 422 and "ECHO-MARKER" not in r.text


# -- 17: bad inputs are one clear 422 naming the field, never a 500 or a traceback ---------------------
def _nested(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth):
        value = {"a": value}
    return value


BAD_INPUTS = [
    ("base_url", '{"base_url": "http://[::1"}'),
    ("agent_timeout_s", '{"agent_timeout_s": NaN}'),
    ("temperature", '{"temperature": Infinity}'),
    ("max_turns", '{"max_turns": 1e400}'),
    ("instruction", '{"instruction": "draw \\ud800"}'),
    ("setup", '{"setup": ["echo \\udcff"]}'),
    ("verify", '{"verify": ["test \\ud83d"]}'),
    ("files", '{"files": {"a.txt": "\\ud800"}}'),
    ("files", '{"files": {"\\udc80.txt": "x"}}'),
    ("files", '{"files": {"a": "x", "a/b": "y"}}'),
    ("files", json.dumps({"files": {"d/" + "n" * 300: "x"}})),
    ("harness_config", json.dumps({"harness": "opencode", "harness_config": _nested(900)})),
    ("model", '{"model": "m\\ud800"}'),
    # issue 25: NUL bytes fail at validation, not at verify time; a URL with credentials is refused unquoted
    ("verify", '{"verify": ["test -f a\\u0000b"]}'),
    ("setup", '{"setup": ["echo \\u0000"]}'),
    ("task_id", '{"task_id": "t\\u0000"}'),
    ("files", '{"files": {"a\\u0000.txt": "x"}}'),
    ("base_url", '{"base_url": "http://bob:hunter2-pw@127.0.0.1:9/v1"}'),
    ("base_url", '{"base_url": "http://127.0.0.1:9/v1?api_key=hunter2-pw"}'),
]


def _with_defaults(override: str, base_url: str) -> bytes:
    # Merged as text: NaN, Infinity, 1e400 and lone surrogates must reach the server as sent.
    base = json.dumps({"instruction": "x", "base_url": base_url, "model": "m", "harness": "whitebox", "agent_timeout_s": 30})
    return (base[:-1] + ", " + override[1:]).encode()


@pytest.mark.parametrize("field,override", BAD_INPUTS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_INPUTS)])
def test_bad_input_is_one_clear_422_naming_the_field(open_server, policy_server, field, override):
    body = _with_defaults(override, policy_server.base_url)
    r = httpx.post(open_server.url + "/rollout", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 422, r.text[:1000]
    assert field in r.text, r.text[:1000]
    _no_leak(r.text, open_server)
    assert "hunter2" not in r.text
    rpc = b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "run_rollout", "arguments": ' + body + b"}}"
    r = httpx.post(open_server.url + "/mcp", content=rpc, headers={"content-type": "application/json", "accept": "*/*"}, timeout=60)
    assert r.status_code == 200 and field in r.json()["error"]["message"], r.text[:1000]
    _no_leak(r.text, open_server)
    # The MCP transport (the SDK's face): an error naming the field, not a rollout run without it.
    r = httpx.post(
        open_server.url + "/mcp", content=rpc, timeout=60, headers={"content-type": "application/json", "accept": "application/json, text/event-stream"}
    )
    answer = json.loads(r.text.split("data: ", 1)[1] if r.text.startswith("event:") else r.text)
    said = answer["error"]["message"] if "error" in answer else answer["result"]["content"][0]["text"]
    assert "error" in answer or answer["result"]["isError"], r.text[:1000]
    assert field in said, said
    _no_leak(r.text, open_server)
    assert policy_server.policy.requests == []  # refused before anything ran
    jobs = httpx.post(open_server.url + "/rollouts", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert jobs.status_code == 422 and field in jobs.text, jobs.text[:1000]  # a job is refused too: nothing stored
    assert "hunter2" not in r.text + jobs.text and "hunter2" not in httpx.get(open_server.url + "/rollouts", timeout=30).text
    assert "Traceback" not in _log(open_server)
    open_server.assert_no_rollout_left()


# -- 15: the plain JSON-RPC face and the session socket cancel on disconnect ---------------------------
def _slow_args(policy_server) -> dict:
    policy_server.policy.scripts["slow"] = [{"hang": 120}]
    return {"instruction": "x", "base_url": policy_server.base_url, "model": "slow", "harness": "whitebox", "agent_timeout_s": 120}


def _wait_running(server: ServerProcess, n: int = 1, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(server.url + "/health").json()["rollouts_running"] >= n:
            return
        time.sleep(0.1)
    raise AssertionError("the rollout never started")


@pytest.mark.parametrize("batch", [False, True])
def test_json_rpc_client_that_goes_away_cancels_its_rollouts(open_server, policy_server, batch):
    args = _slow_args(policy_server)
    body = json.dumps([_rpc("run_rollout", args, i) for i in range(3)] if batch else _rpc("run_rollout", args)).encode()
    with socket.create_connection(("127.0.0.1", open_server.port), timeout=15) as s:  # OpenEnv's client, as it sends
        s.sendall(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: */*\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        _wait_running(open_server)
    # The socket is closed mid-call: the rollouts (each waiting 120 s on the model) end.
    open_server.assert_no_rollout_left(timeout_s=60)
    time.sleep(1)  # a batch's next call must not start either
    assert httpx.get(open_server.url + "/health").json()["rollouts_running"] == 0


def test_session_socket_client_that_goes_away_cancels_its_rollout(open_server, policy_server):
    args = _slow_args(policy_server)
    ws = ws_connect(open_server.url.replace("http://", "ws://") + "/ws")
    ws.send(json.dumps({"type": "step", "data": {"type": "call_tool", "tool_name": "run_rollout", "arguments": args}}))
    _wait_running(open_server)
    ws.close()
    open_server.assert_no_rollout_left(timeout_s=10)


# -- 16: any bearer, cookie or socket token gives 401, never a 500 -------------------------------------
def test_non_ascii_credentials_are_refused_not_crashed(token_server):
    with _from("127.0.0.21") as c:
        for value in (b"Bearer \xc3\xa9t\xc3\xa9", b"Bearer \xff\xfe", "Bearer tok-é".encode()):
            r = c.get(token_server.url + "/harnesses", headers={"authorization": value})
            assert r.status_code == 401, r.text
        for value in (b"\xc3\xa9", b'"\\351\\777"', b'"\xff"'):
            r = c.get(token_server.url + "/web/config", headers={"cookie": WEB_COOKIE.encode() + b"=" + value})
            assert r.status_code == 401, r.text
    # A refused socket is closed before its handshake (uvicorn answers 403); before, a 500.
    assert _ws_handshake(token_server, b"/ws?token=%C3%A9%FF", source="127.0.0.22") == 403
    assert _ws_handshake(token_server, b"/ws?token=%ED%A0%80", source="127.0.0.22") == 403
    assert _ws_handshake(token_server, b"/ws?token=" + TOKEN.encode(), source="127.0.0.22") == 101  # the check can pass
    assert "Traceback" not in _log(token_server)


# -- 18: the token is not logged -----------------------------------------------------------------------
def test_socket_token_is_redacted_from_the_log(token_server):
    with ws_connect(token_server.url.replace("http://", "ws://") + f"/ws?token={TOKEN}") as ws:
        ws.send(json.dumps({"type": "state"}))
        assert json.loads(ws.recv())["type"] == "state"
    with _from("127.0.0.31") as c:
        assert c.get(token_server.url + f"/harnesses?token={TOKEN}&x=1", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
    time.sleep(0.5)
    log = _log(token_server)
    assert "/ws?token=[redacted]" in log and "/harnesses?token=[redacted]&x=1" in log, log[-2000:]
    assert TOKEN not in log


# -- 19: pages of another origin can neither read /web nor call the API with the user's cookie -------
def test_another_origin_gets_no_web_config_and_no_cors_grant(token_server):
    cookie = {"cookie": f"{WEB_COOKIE}={web_session_value(TOKEN)}"}
    with _from("127.0.0.41") as c:
        own = c.get(token_server.url + "/web/config", headers={**cookie, "origin": token_server.url}, timeout=120)
        assert own.status_code == 200 and "components" in own.json()  # the cookie opens it from its own page
        for origin in ("http://localhost:9999", "http://127.0.0.1:9999", "null", "https://evil.example"):
            r = c.get(token_server.url + "/web/config", headers={**cookie, "origin": origin})
            assert r.status_code == 403 and "components" not in r.text, (origin, r.text[:300])
            assert "access-control-allow-origin" not in r.headers and "access-control-allow-credentials" not in r.headers
            pre = c.options(token_server.url + "/web/gradio_api/queue/join", headers={"origin": origin, "access-control-request-method": "POST"})
            assert pre.status_code == 403 and "access-control-allow-origin" not in pre.headers
            join = c.post(
                token_server.url + "/web/gradio_api/queue/join",
                headers={**cookie, "origin": origin},
                content=b'{"data": [], "fn_index": 0, "session_hash": "x"}',
            )
            assert join.status_code == 403
            api = c.post(
                token_server.url + "/mcp",
                headers={"authorization": f"Bearer {TOKEN}", "origin": origin, "accept": "*/*"},
                json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            )
            assert api.status_code == 403


def test_a_chunked_300_mb_upload_to_the_web_ui_is_cut_off_too(token_server):
    cookie = {"cookie": f"{WEB_COOKIE}={web_session_value(TOKEN)}"}
    with _from("127.0.0.42") as c:
        assert c.get(token_server.url + "/web/config", headers=cookie, timeout=120).status_code == 200  # the UI is loaded
        before, sent = _rss_mb(token_server), [0]

        def upload():
            yield b'--XyZ\r\nContent-Disposition: form-data; name="files"; filename="a.bin"\r\n\r\n'
            yield from _chunks(300, sent)

        r = c.post(
            token_server.url + "/web/gradio_api/upload", content=upload(), timeout=120, headers={**cookie, "content-type": "multipart/form-data; boundary=XyZ"}
        )
    assert r.status_code == 413 and sent[0] < 100 * MB, (r.status_code, sent[0] // MB)
    assert _rss_mb(token_server) - before < 100


# -- 20: failed authentication is rate-limited per address, and the right token still gets in -----
def test_guessing_the_token_is_stopped_per_address(token_server):
    with _from("127.0.0.51") as guesser, _from("127.0.0.52") as other:
        statuses = [guesser.get(token_server.url + "/harnesses", headers={"authorization": f"Bearer guess-{i}"}).status_code for i in range(50)]
        assert statuses[:10] == [401] * 10 and set(statuses[10:]) == {429}, statuses
        r = guesser.get(token_server.url + "/harnesses", headers={"authorization": "Bearer guess-x"})
        assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 5
        # Another address is not affected ...
        assert other.get(token_server.url + "/harnesses", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert _ws_handshake(token_server, b"/ws?token=" + TOKEN.encode(), source="127.0.0.52") == 101
        # ... and from the guessing address the right token gets in once its turn comes (before: a
        # minute of 429 for everyone there), while a new guess is again one per interval.
        right = guesser.get(token_server.url + "/harnesses", headers={"authorization": f"Bearer {TOKEN}"})
        if right.status_code == 429:
            time.sleep(int(right.headers["retry-after"]))
            right = guesser.get(token_server.url + "/harnesses", headers={"authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 200
        assert _ws_handshake(token_server, b"/ws?token=" + TOKEN.encode(), source="127.0.0.51") == 101
        assert guesser.get(token_server.url + "/harnesses", headers={"authorization": "Bearer guess-y"}).status_code == 401
        assert guesser.get(token_server.url + "/harnesses", headers={"authorization": "Bearer guess-z"}).status_code == 429


def test_guessing_at_the_login_form_and_the_socket_is_stopped_too(token_server):
    with _from("127.0.0.61") as c:
        statuses = [c.post(token_server.url + "/web/login", data={"token": f"guess-{i}"}).status_code for i in range(12)]
        assert statuses[:10] == [401] * 10 and statuses[10:] == [429, 429], statuses
    assert {_ws_handshake(token_server, f"/ws?token=guess-{i}".encode(), source="127.0.0.62") for i in range(10)} == {403}
    # Slowed now: a new guess from there is refused unchecked; the right token gets in after one interval.
    assert _ws_handshake(token_server, b"/ws?token=guess-new", source="127.0.0.62") == 403
    assert _ws_handshake(token_server, b"/ws?token=" + TOKEN.encode(), source="127.0.0.64") == 101
    time.sleep(5)
    assert _ws_handshake(token_server, b"/ws?token=" + TOKEN.encode(), source="127.0.0.62") == 101
    with _from("127.0.0.61") as c:  # the login form's guesser too
        ok = c.post(token_server.url + "/web/login", data={"token": TOKEN}, follow_redirects=False)
        assert ok.status_code == 303 and WEB_COOKIE in ok.headers["set-cookie"]
    with _from("127.0.0.63") as c:
        ok = c.post(token_server.url + "/web/login", data={"token": TOKEN}, follow_redirects=False)
        assert ok.status_code == 303 and WEB_COOKIE in ok.headers["set-cookie"]
