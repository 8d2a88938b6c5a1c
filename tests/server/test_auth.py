"""server/auth.py in-process: token comparison for any input, the failed-authentication limiter
(with an injected clock), foreign origins. tests/server/test_hardening.py performs
the same attacks on a real server."""

import httpx
import pytest
from fastapi import FastAPI

from harness_env.server.auth import AuthFailureLimiter, TokenAuth, is_foreign_origin, same_secret


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_same_secret_never_raises():
    assert same_secret("pässwort", "pässwort") and same_secret("pässwort".encode(), "pässwort")
    for given in ("é", "\ud800", "\udcff", b"\xff\xfe", "", b""):
        assert same_secret(given, "tok") is False
    assert same_secret("\udcff", "\udcff")  # a token from os.environ that was not UTF-8


def test_limiter_slows_an_address_after_its_failures_and_only_it():
    clock = Clock()
    lim = AuthFailureLimiter(max_failures=3, window_s=60, backoff_s=30, slow_interval_s=5, clock=clock)
    for _ in range(2):
        lim.failed("a")
    assert lim.retry_after("a") is None
    lim.failed("a")
    assert lim.retry_after("a") == 5 and lim.retry_after("b") is None
    clock.now += 4.5
    assert lim.retry_after("a") == 1
    clock.now += 1
    assert lim.retry_after("a") is None  # one new credential may be checked ...
    lim.failed("a")
    assert lim.retry_after("a") == 5  # ... and if it was wrong, the next waits again
    clock.now += 31
    assert lim.retry_after("a") is None  # no failure for backoff_s: full speed again, the count afresh
    lim.failed("a")
    assert lim.retry_after("a") is None


def test_slowed_guessing_stays_at_one_guess_per_interval():
    clock = Clock()
    lim = AuthFailureLimiter(max_failures=10, window_s=60, backoff_s=60, slow_interval_s=5, clock=clock)
    checked = 0
    for _ in range(6000):  # ten minutes of a guess every 0.1 s
        if lim.retry_after("a") is None:
            checked += 1
            lim.failed("a")
        clock.now += 0.1
    assert checked <= 10 + 600 / 5 + 1, checked


def test_a_wrong_credential_sent_again_is_recognised_and_not_counted():
    lim = AuthFailureLimiter(max_failures=3, clock=Clock())
    lim.failed("a", [(b"stale", "tok")])
    assert lim.known_wrong("a", b"stale", "tok") and lim.known_wrong("a", "stale", "tok")
    assert not lim.known_wrong("b", b"stale", "tok") and not lim.known_wrong("a", b"stale", "cookie-value")
    assert not lim.known_wrong("a", b"tok", "tok")


def test_limiter_forgets_failures_outside_its_window_and_stays_bounded():
    clock = Clock()
    lim = AuthFailureLimiter(max_failures=3, window_s=60, backoff_s=30, max_addresses=100, clock=clock)
    for _ in range(10):  # a slow guesser, under the rate, is never slowed
        lim.failed("slow")
        clock.now += 31
        assert lim.retry_after("slow") is None
    for i in range(1000):
        for _ in range(3):
            lim.failed(f"10.0.{i // 256}.{i % 256}", [(f"guess-{i}", "tok")])
    assert len(lim._failures) <= 100 and len(lim._slowed_until) <= 100 and len(lim._wrong) <= 100
    assert len(lim._last_failure) <= 100


def _app(token: str) -> TokenAuth:
    app = FastAPI()

    @app.get("/harnesses")
    async def harnesses():
        return []

    return TokenAuth(app, token, own_origins=["http://127.0.0.1:8000"], limiter=AuthFailureLimiter(max_failures=3))


async def test_a_non_ascii_token_works_and_wrong_ones_are_401_then_429():
    app = _app("pässwort")
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("10.0.0.1", 1)), base_url="http://t") as c,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("10.0.0.2", 1)), base_url="http://t") as other,
    ):
        ok = await c.get("/harnesses", headers={"authorization": "Bearer pässwort".encode()})
        assert ok.status_code == 200
        statuses = [
            (await c.get("/harnesses", headers={"authorization": v})).status_code
            for v in (b"Bearer p\xe4sswort", b"Bearer \xff", "Bearer é".encode(), b"Bearer x")
        ]
        assert statuses == [401, 401, 401, 429]
        assert (await other.get("/harnesses", headers={"authorization": "Bearer pässwort".encode()})).status_code == 200
        # No credential at all is not a guess: it never blocks.
        assert [(await other.get("/harnesses")).status_code for _ in range(5)] == [401] * 5


async def test_the_right_token_gets_in_from_an_address_that_guessed_wrong():
    """Ten wrong tokens from an address (a loopback client, everyone behind one proxy) locked the
    right one out from there for 60 s: now it waits at most one slow interval after the last
    wrong guess, and a stale client resending its wrong token does not hold anyone up."""
    clock = Clock()
    limiter = AuthFailureLimiter(max_failures=3, window_s=60, backoff_s=60, slow_interval_s=5, clock=clock)
    inner = FastAPI()

    @inner.get("/harnesses")
    async def harnesses():
        return []

    app = TokenAuth(inner, "right-token", own_origins=[], limiter=limiter)
    right, stale = {"authorization": "Bearer right-token"}, {"authorization": "Bearer stale-token"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("10.0.0.9", 1)), base_url="http://t") as c:
        for i in range(3):
            assert (await c.get("/harnesses", headers={"authorization": f"Bearer guess-{i}"})).status_code == 401
        blocked = await c.get("/harnesses", headers={"authorization": "Bearer guess-3"})
        assert blocked.status_code == 429 and blocked.headers["retry-after"] == "5"  # guessing is slowed ...
        early = await c.get("/harnesses", headers=right)
        assert early.status_code == 429 and int(early.headers["retry-after"]) <= 5  # ... a new credential waits its turn
        clock.now += int(early.headers["retry-after"])
        assert (await c.get("/harnesses", headers=right)).status_code == 200  # ... and the right one then gets in
        assert (await c.get("/harnesses", headers=right)).status_code == 200  # every time: a success is no failure
        assert (await c.get("/harnesses", headers={"authorization": "Bearer guess-4"})).status_code == 401
        assert (await c.get("/harnesses", headers={"authorization": "Bearer guess-5"})).status_code == 429
        # A stale client resending a wrong token: 401 at once, uncounted, holding nobody up.
        clock.now += 61
        assert (await c.get("/harnesses", headers=stale)).status_code == 401
        assert [(await c.get("/harnesses", headers=stale)).status_code for _ in range(50)] == [401] * 50
        assert (await c.get("/harnesses", headers=right)).status_code == 200
        assert limiter.retry_after("10.0.0.9") is None


async def test_behind_a_private_space_the_token_comes_in_its_own_header():
    """A private Space's front door takes the Hugging Face token in Authorization (and passes it on):
    the server's token then comes in X-Harness-Env-Token."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app("tok"), client=("10.0.0.3", 1)), base_url="http://t") as c:
        hf = {"authorization": "Bearer hf_someone"}
        assert (await c.get("/harnesses", headers={**hf, "x-harness-env-token": "tok"})).status_code == 200
        assert (await c.get("/harnesses", headers={"x-harness-env-token": "tok"})).status_code == 200
        wrong = await c.get("/harnesses", headers={**hf, "x-harness-env-token": "nope"})
        assert wrong.status_code == 401 and "X-Harness-Env-Token" in wrong.json()["error"]["message"]


@pytest.mark.parametrize(
    "headers,foreign",
    [
        ({}, False),
        ({"origin": "http://127.0.0.1:8000"}, False),  # the public URL
        ({"origin": "http://LOCALHOST:8000", "host": "localhost:8000"}, False),  # the host it was sent to
        ({"origin": "https://space.hf.space", "host": "10.0.0.5:7860", "x-forwarded-host": "space.hf.space"}, False),
        ({"origin": "http://localhost:9999", "host": "127.0.0.1:8000"}, True),
        ({"origin": "http://127.0.0.1:9999", "host": "127.0.0.1:8000"}, True),
        ({"origin": "null", "host": "127.0.0.1:8000"}, True),
        ({"origin": "http://[::1", "host": "127.0.0.1:8000"}, True),
    ],
)
def test_foreign_origins(headers, foreign):
    scope = {"headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    assert is_foreign_origin(scope, {"http://127.0.0.1:8000"}) is foreign
