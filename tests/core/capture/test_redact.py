"""Secret masking: full values, long pieces, JSON spellings, streams split anywhere, the registry."""

import json

import pytest

from harness_env.core.capture.redact import MASK, MAX_STREAM_CARRY, Redactor, StreamRedactor, register_secret, registered_secrets, unregister_secret
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.session import CaptureSession
from harness_env.models import Endpoint

KEY = "sk-proj-Q7xv9LmN2pRt8ZkW4yHc6JdB3sFg5TaE"  # 40 characters


def test_full_secret_is_masked_in_text_and_bytes():
    r = Redactor([KEY])
    text = f"Incorrect API key provided: {KEY}. Again: {KEY}"
    assert r.redact(text) == f"Incorrect API key provided: {MASK}. Again: {MASK}"
    assert r.redact_bytes(text.encode()) == r.redact(text).encode()


@pytest.mark.parametrize("piece", [KEY[:20], KEY[:31], KEY[-20:], KEY[-33:]])
def test_a_prefix_or_suffix_of_at_least_half_is_masked(piece):
    r = Redactor([KEY])
    assert r.redact(f"key {piece}...") == f"key {MASK}..."
    assert piece not in r.redact(f"x{piece}y")


@pytest.mark.parametrize("kept", [KEY[:19], KEY[-19:], "sk-proj-****TaE", KEY[:4] + "..." + KEY[-4:], "sk-proj-"])
def test_short_pieces_and_masked_forms_are_left(kept):
    assert Redactor([KEY]).redact(f"key {kept}.") == f"key {kept}."


def test_short_secrets_are_ignored_and_empty_redactor_is_identity():
    r = Redactor(["", "abc1234"])  # under 8 characters: would mangle ordinary text
    assert not r and r.redact("abc1234") == "abc1234" and r.redact_bytes(b"abc1234") == b"abc1234"
    assert StreamRedactor(r).feed(b"abc1234 no newline") == b"abc1234 no newline"  # nothing held back


def test_json_escaped_spelling_is_masked():
    secret = 'tok/en"with\\odd/chars'
    r = Redactor([secret])
    for body in (json.dumps({"m": secret}), json.dumps({"m": secret}).replace("/", "\\/")):
        out = r.redact_bytes(body.encode())
        assert json.loads(out) == {"m": MASK}, out


def test_redact_value_walks_json_values():
    r = Redactor([KEY])
    value = [{"role": "tool", "content": f"env: {KEY}", KEY: [1, None, {"x": KEY[:25]}]}]
    assert r.redact_value(value) == [{"role": "tool", "content": f"env: {MASK}", MASK: [1, None, {"x": MASK}]}]
    assert r.found_in(json.dumps(value).encode()) and not r.found_in(b"nothing here")


def test_stream_split_at_every_point_never_lets_the_key_through():
    r = Redactor([KEY])
    data = f'data: {{"delta": "a {KEY} b"}}\n\ndata: {{"x": "{KEY}"}}\n\ndata: [DONE]\n\n'.encode()
    expected = r.redact_bytes(data)
    assert KEY.encode() not in expected and expected.count(MASK.encode()) == 2
    for i in range(len(data) + 1):
        for j in range(i, len(data) + 1, 7):
            s = StreamRedactor(r)
            out = s.feed(data[:i]) + s.feed(data[i:j]) + s.feed(data[j:]) + s.flush()
            assert out == expected, (i, j)


def test_stream_holds_back_only_an_unfinished_line():
    s = StreamRedactor(Redactor([KEY]))
    assert s.feed(b'data: {"a": 1}\n\ndata: {"b"') == b'data: {"a": 1}\n\n'
    assert s.feed(b": 2}\n\n") == b'data: {"b": 2}\n\n'
    assert s.flush() == b""


def test_stream_with_a_huge_unfinished_line_is_still_masked():
    r = Redactor([KEY])
    s = StreamRedactor(r)
    first = b"x" * (MAX_STREAM_CARRY + 10) + KEY[:12].encode()  # a line longer than the carry limit
    out = s.feed(first)
    assert 0 < len(out) < len(first)  # it does not wait for the line's end
    out += s.feed(KEY[12:].encode() + b" tail") + s.flush()
    assert KEY.encode() not in out and out.endswith(MASK.encode() + b" tail")


def test_registry_reaches_open_sessions_and_can_be_undone():
    judge = "judge-key-0123456789abcdef"
    session = CaptureSession(key="k", endpoint=Endpoint(base_url="http://x/v1", api_key=KEY, model="m"), policy=CapturePolicy())
    assert session.redact(f"{KEY} {judge}") == f"{MASK} {judge}"
    register_secret(judge)
    register_secret(judge)  # two owners of one value
    register_secret("short")  # ignored: under 8 characters
    try:
        assert judge in registered_secrets() and "short" not in registered_secrets()
        assert session.redact(f"{KEY} {judge}") == f"{MASK} {MASK}"  # registered after the session opened
        unregister_secret(judge)
        assert session.redact(judge) == MASK  # the other owner still holds it
    finally:
        unregister_secret(judge)
    assert judge not in registered_secrets() and session.redact(judge) == judge


def test_a_secret_of_several_lines_is_masked_line_by_line_in_streams():
    pem = "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END KEY-----"
    r = Redactor([pem])
    assert r.redact("echo: MIIEvQIBADANBgkqhkiG9w0BAQEFAASC") == f"echo: {MASK}"  # one line of it alone
    data = f"data: {pem}\n\n".encode()
    for i in range(len(data) + 1):
        for j in range(i, len(data) + 1):
            s = StreamRedactor(r)
            out = s.feed(data[:i]) + s.feed(data[i:j]) + s.feed(data[j:]) + s.flush()
            assert b"MIIEvQIBADANBgkq" not in out and b"ADANBgkqhkiG9w0BAQEFAASC" not in out, (i, j)
    assert json.loads(r.redact(json.dumps({"k": pem}))) == {"k": MASK}  # whole, as a JSON string


def test_stream_lines_ended_by_a_lone_cr_are_not_held_back():
    s = StreamRedactor(Redactor([KEY]))
    assert s.feed(f"data: {KEY}\r\rdata: x".encode()) == f"data: {MASK}\r\r".encode()


# -- every spelling a reader decodes back to the secret (issue 25: \uXXXX escapes) ---------------
def _u(c, upper=False):
    code = f"\\u{ord(c):04x}"
    return code.upper().replace("\\U", "\\u") if upper else code


def _decoded_forms(secret):
    """The secret written so that a JSON reader (or a URL / base64 decoder) gets it back."""
    every = "".join(_u(c) for c in secret)
    return {
        "every char \\u, lower hex": every,
        "every char \\u, upper hex": "".join(_u(c, upper=True) for c in secret),
        "mixed plain and escaped": "".join(_u(c) if i % 3 == 0 else c for i, c in enumerate(secret)),
        "mixed hex case": "".join(_u(c, upper=i % 2 == 0) for i, c in enumerate(secret)),
        "slash escaped": secret.replace("/", "\\/"),
        "half of it escaped (a truncated echo)": "".join(_u(c) for c in secret[: len(secret) // 2 + 2]) + "...",
    }


SLASHED = "sk-ant/Q7xv9LmN2pRt8/ZkW4yHc6JdB3sFg5TaE"


@pytest.mark.parametrize("secret", [KEY, SLASHED])
@pytest.mark.parametrize("partial", [True, False])
def test_json_escapes_of_any_character_are_masked_as_a_reader_decodes_them(secret, partial):
    r = Redactor([secret], partial=partial)
    for name, form in _decoded_forms(secret).items():
        if name.startswith("half") and not partial:
            continue  # the answers' redactor masks whole secrets only
        body = ('{"error": {"message": "Incorrect API key provided: ' + form + '", "type": "invalid_request_error"}}').encode()
        decoded = json.loads(r.redact_bytes(body))["error"]["message"]
        assert secret[:12] not in decoded and secret[-12:] not in decoded and MASK in decoded, name
        assert secret[:12] not in json.loads(r.redact(body.decode()))["error"]["message"], name
        assert r.found_in(body), name


def test_escapes_nested_in_a_json_string_inside_json_are_masked():
    inner = '{"detail": "' + "".join(_u(c) for c in KEY) + '"}'  # a JSON text, itself in a JSON string below
    body = json.dumps({"error": {"message": inner}}).encode()
    assert "\\\\u" in body.decode()
    out = Redactor([KEY]).redact_bytes(body)
    assert KEY[:12] not in json.loads(json.loads(out)["error"]["message"])["detail"]


@pytest.mark.parametrize(
    "spell",
    [
        lambda c: f"\\u005cu{ord(c):04x}",  # the backslash itself escaped: a reader that decodes twice
        lambda c: f"%5Cu{ord(c):04x}",  # a JSON escape, URL-encoded
        lambda c: f"%25{ord(c):02x}",  # percent-encoded twice
    ],
)
def test_escapes_written_with_escapes_are_masked(spell):
    text = "key: " + "".join(spell(c) for c in KEY) + " end"
    out = Redactor([KEY]).redact(text)
    assert out == f"key: {MASK} end", out


def test_percent_and_base64_encodings_are_masked():
    import base64
    from urllib.parse import quote, unquote

    r = Redactor([KEY])
    every = "".join(f"%{b:02X}" for b in KEY.encode())
    assert KEY[:12] not in unquote(r.redact(f"https://x/?k={every}")) and KEY[:12] not in unquote(r.redact(quote(KEY, safe="")))
    for prefix in ("", "u:", "us:"):  # each alignment of the secret inside the encoded text
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode((prefix + KEY + "!").encode()).decode()
            out = r.redact("Basic " + encoded)
            assert MASK in out and encoded[8:-8] not in out and len(out) < len(encoded) // 2, (prefix, out)


def test_hex_dumps_of_the_secret_are_masked():
    r = Redactor([KEY])
    for dump in (KEY.encode().hex(), KEY.encode().hex().upper(), ("Bearer " + KEY).encode().hex()):
        out = r.redact(f"header bytes: {dump} end")
        assert MASK in out and KEY.encode().hex()[4:-4] not in out.lower(), out


def test_text_without_the_secret_is_untouched_by_the_escape_scan():
    r = Redactor([KEY])
    text = '{"content": "caf\\u00e9 100% \\/ done \\u0073\\u006b"}'  # escapes, but of other text
    assert r.redact(text) == text and r.redact_bytes(text.encode()) == text.encode()


def test_stream_split_inside_escapes_never_lets_the_key_through():
    r = Redactor([KEY])
    escaped = "".join(_u(c) for c in KEY)
    data = f'data: {{"delta": "a {escaped} b"}}\n\ndata: [DONE]\n\n'.encode()
    for i in range(0, len(data) + 1, 3):
        s = StreamRedactor(r)
        out = s.feed(data[:i]) + s.feed(data[i:]) + s.flush()
        event = json.loads(out.split(b"\n\n")[0][6:])
        assert KEY[:12] not in event["delta"] and MASK in event["delta"], i


async def test_a_long_body_is_masked_off_the_event_loop_all_the_same():
    from harness_env.core.capture.redact import MASK_IN_THREAD_BYTES, masked

    escaped = "".join(_u(c) for c in KEY)
    body = json.dumps({"error": {"message": "x" * MASK_IN_THREAD_BYTES, "echo": "%s"}}).replace("%s", escaped).encode()
    out = await masked(Redactor([KEY]), body)
    assert json.loads(out)["error"]["echo"] == MASK
