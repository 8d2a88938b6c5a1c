"""server/log_secrets.py: no secret of the server reaches its log, in any position of a line or any
usual encoding. In-process on log records, then on the real log of a real `harness-env serve`
that is sent the token (and a catalog key, and capture keys) in paths, queries and encodings."""

import base64
import logging
import re
import time
from urllib.parse import quote, unquote_plus

import httpx
import pytest

from harness_env.core.capture.redact import register_secret, unregister_secret
from harness_env.core.capture.session import new_session_key
from harness_env.server.log_secrets import CAPTURE_KEY, LogMasker, mask_record, mask_secrets_in_logs
from tests.server_process import ServerProcess, raw_status

TOKEN = "tok-Lg5Qz8Rk2Wm7Xp"
KEY = "sk-catalog-log-3f9a7c1e"
CAPTURE = "hecap-" + "Zq9" * 10 + "xy"
URL_PASSWORD = "url-pass-8d2k4"


def every_byte_escaped(secret: str, fmt: str = "%{:02x}") -> str:
    return "".join(fmt.format(b) for b in secret.encode())


def spellings_sent(secret: str) -> dict[str, str]:
    """The forms of `secret` the tests send, each named: what the log must show none of."""
    return {
        "raw": secret,
        "percent, every byte": every_byte_escaped(secret),
        "percent, upper case": every_byte_escaped(secret, "%{:02X}"),
        "percent, half": every_byte_escaped(secret[:8]) + secret[8:],
        "percent, twice": quote(every_byte_escaped(secret), safe=""),
        "base64 of user:secret": base64.b64encode(b"user:" + secret.encode()).decode(),
        "base64, offset 1": base64.b64encode(b"ab:" + secret.encode()).decode(),
        "base64 url-safe, no padding": base64.urlsafe_b64encode(b"a:" + secret.encode()).decode().rstrip("="),
        "hex": secret.encode().hex(),
        "json escapes": every_byte_escaped(secret, "\\u{:04x}"),
    }


def leaks(text: str, secret: str) -> list[str]:
    """Where `secret` shows in `text`: as sent in any spelling, or once the text's escapes are undone."""
    found = [name for name, form in spellings_sent(secret).items() if form in text]
    decoded = text
    for _ in range(3):
        decoded = unquote_plus(decoded)
    if secret in decoded:
        found.append("after percent-decoding")
    for run in re.findall(r"[A-Za-z0-9+/_-]{16,}={0,2}", text):  # any base64 word, decoded at face value
        for alphabet in (b"+/", b"-_"):
            try:
                raw = base64.b64decode(run + "=" * (-len(run) % 4), altchars=alphabet)
            except ValueError:
                continue
            if secret.encode() in raw:
                found.append(f"in base64 {run[:12]}...")
    return found


@pytest.fixture
def masker():
    return LogMasker({TOKEN, KEY})


@pytest.mark.parametrize("name", list(spellings_sent(TOKEN)))
@pytest.mark.parametrize("where", ["GET /nope/{} HTTP/1.1", "GET /harnesses?q={}&x=1 HTTP/1.1", "Authorization: Basic {}", "error: {}."])
def test_every_spelling_of_a_secret_is_masked_anywhere_in_a_line(masker, name, where):
    for secret in (TOKEN, KEY):
        line = where.format(spellings_sent(secret)[name])
        masked = masker.mask(line)
        assert not leaks(masked, secret), (line, masked)
        assert "[redacted]" in masked and masked.split(" ")[0] == line.split(" ")[0]  # the rest of the line stays


def test_ordinary_lines_are_left_alone(masker):
    for line in ('127.0.0.1:5 - "GET /web/?__theme=dark HTTP/1.1" 200', "a+b=c and 100% done, path\\to", "/x?y=%20z"):
        assert masker.mask(line) == line


def test_capture_keys_and_secret_named_parameters_are_masked_even_unknown(masker):
    assert CAPTURE_KEY.fullmatch(new_session_key())  # the pattern follows the keys the proxy makes
    assert masker.mask(f"/capture/v1/{CAPTURE}/x") == "/capture/v1/[redacted]/x"
    assert masker.mask("/a?x=1&api_key=guess&access_token=t") == "/a?x=1&api_key=[redacted]&access_token=[redacted]"


def test_a_record_keeps_its_shape_and_loses_its_secrets():
    register_secret(TOKEN)
    try:
        access = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d', ("1.2.3.4:5", "GET", f"/nope/{TOKEN}", "1.1", 401), None)
        mask_record(access)
        assert access.args == ("1.2.3.4:5", "GET", "/nope/[redacted]", "1.1", 401)  # uvicorn's formatter unpacks these
        try:
            raise ValueError(f"bad token {every_byte_escaped(TOKEN)}")
        except ValueError:
            import sys

            failed = logging.LogRecord("x", logging.ERROR, "", 0, "failed: %s %r", (ValueError(TOKEN), {"k": TOKEN}), sys.exc_info())
        mask_record(failed)
        text = logging.Formatter().format(failed)
        assert "ValueError" in text and "[redacted]" in text and not leaks(text, TOKEN), text
    finally:
        unregister_secret(TOKEN)


def test_a_secret_split_over_two_arguments_is_masked_as_one():
    register_secret(TOKEN)
    try:
        record = logging.LogRecord("harness_env.x", logging.INFO, "", 0, "key=%s%s (%d)", (TOKEN[:5], TOKEN[5:], 3), None)
        mask_record(record)
        assert record.getMessage() == "key=[redacted] (3)"
        odd = logging.LogRecord("harness_env.x", logging.INFO, "", 0, "two %s %s", (TOKEN,), None)  # a bad call: masked anyway
        mask_record(odd)
        assert TOKEN not in str(odd.msg) + str(odd.args)
    finally:
        unregister_secret(TOKEN)


def test_every_logger_of_the_process_is_masked_once_installed(caplog):
    mask_secrets_in_logs()
    mask_secrets_in_logs()  # once per process, however often the app is made
    assert type(logging.getLogRecordFactory()).__name__ == "_MaskingFactory"
    assert type(logging.getLogRecordFactory().inner).__name__ != "_MaskingFactory"
    register_secret(TOKEN)
    try:
        with caplog.at_level(logging.INFO):
            logging.getLogger("some.library.deep.down").info("sent %s", base64.b64encode(b"u:" + TOKEN.encode()).decode())
            logging.getLogger().warning(f"root {TOKEN}")
        assert not leaks(caplog.text, TOKEN) and caplog.text.count("[redacted]") == 2, caplog.text
    finally:
        unregister_secret(TOKEN)


# -- a real server's log ------------------------------------------------------------------------------
def _raw_request(server: ServerProcess, target: str, headers: str = "") -> int:
    """Send `target` exactly as written (no client normalises it); the status code."""
    return raw_status(server.port, f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{headers}\r\n".encode())


@pytest.mark.e2e
def test_a_real_servers_log_holds_no_secret_in_any_position_or_encoding(tmp_path_factory):
    server = ServerProcess(
        tmp_path_factory.mktemp("logs"),
        "--token",
        TOKEN,
        env={
            "HARNESS_ENV_LOG_LEVEL": "info",
            "OPENAI_API_KEY": KEY,
            "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
            "VLLM_URL": f"http://bob:{URL_PASSWORD}@127.0.0.1:9/v1",
            "VLLM_MODEL": "m",
        },
    )
    bearer = f"Authorization: Bearer {TOKEN}\r\n"
    try:
        _catalog_shows_no_url_credentials(server)
        for secret in (TOKEN, KEY, CAPTURE):
            for form in spellings_sent(secret).values():
                safe = quote(form, safe="%")  # what a request line may carry
                assert _raw_request(server, f"/nope/{safe}") == 401  # in a path, without the token
                assert _raw_request(server, f"/harnesses?q={safe}&page=2", bearer) == 200  # a parameter of any name
                assert _raw_request(server, f"/harnesses/{safe}/x?{safe}", bearer) == 404
                assert (
                    _raw_request(
                        server,
                        f"/ws?x={safe}",
                        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n",
                    )
                    == 403
                )
        assert _raw_request(server, f"/capture/v1/{CAPTURE}/chat/completions") in (401, 404, 405)
        time.sleep(0.5)
    finally:
        log = server.stop()
    assert '"GET /nope/[redacted] HTTP/1.1" 401' in log and "/harnesses?q=[redacted]&page=2" in log, log[-3000:]
    for secret in (TOKEN, KEY, CAPTURE, URL_PASSWORD):
        assert not leaks(log, secret), (secret, leaks(log, secret))


def _catalog_shows_no_url_credentials(server: ServerProcess) -> None:
    """The server's VLLM_URL holds a password: the catalog (HTTP and the MCP tool) lists the entry
    without it, as unusable and why; a rollout naming it is one 422 saying where the key goes."""
    auth = {"authorization": f"Bearer {TOKEN}"}
    listed = httpx.get(server.url + "/catalog", headers=auth, timeout=30)
    rpc = httpx.post(
        server.url + "/mcp",
        headers={**auth, "accept": "*/*"},
        timeout=60,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "catalog", "arguments": {}}},
    )
    run = httpx.post(server.url + "/rollout", headers=auth, timeout=60, json={"instruction": "x", "endpoint": "vllm", "harness": "whitebox"})
    for answer in (listed, rpc, run):
        assert URL_PASSWORD not in answer.text and "bob" not in answer.text, answer.text[:2000]
    vllm = next(e for e in listed.json() if e["name"] == "vllm")
    assert vllm["base_url"] == "http://127.0.0.1:9/v1" and not vllm["configured"] and "VLLM_API_KEY" in vllm["problem"]
    assert "VLLM_API_KEY" in rpc.text
    assert run.status_code == 422 and "VLLM_URL" in run.text and "VLLM_API_KEY" in run.text, run.text
