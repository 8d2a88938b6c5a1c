"""Several servers behind one client, for replicas with no load balancer in front (several Spaces,
several machines).

`Servers` is plain state shared by the sync and async clients (locked: the sync client's run_many
calls from threads): which server gets the next rollout (the fewest this client has in flight
there; ties in turn), which ones refused lately (they rest a little, so a busy or unreachable
server is not asked again in a tight loop while another may take the work), and which server
owns each rollout id (a job lives in its server's store). `routed_steps` makes one call on the
best server that takes it; `locate_steps` finds a rollout's server. With one base URL every call
goes to it, as before.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from harness_env.client.steps import BUSY, NEVER_REACHED, Call, HarnessEnvClientError, Pause, Steps, error_of, raise_for
from harness_env.models.jobs import is_rollout_id

REST_START_S, REST_MAX_S = 0.5, 8.0  # a refusing server's rest, doubling while it keeps refusing
CONNECT_RETRIES = 4  # passes over the servers when none was reached (0.5, 1, 2, 4 s apart)
MAX_OWNERS = 100_000  # rollout ids remembered (oldest forgotten first; a forgotten one is looked up)


def redacted(url: str) -> str:
    """An address as an error message may show it: no user name, password or query (a token)."""
    try:
        return str(httpx.URL(url).copy_with(userinfo=b"", query=None, fragment=None))
    except (httpx.InvalidURL, TypeError):
        return "<not a URL>"


def server_urls(base_url: str | None, base_urls: Sequence[str] | None) -> list[str]:
    """The client's servers, from its one `base_url` or its `base_urls`; ValueError saying what is
    wrong with them."""
    if base_url is not None and base_urls is not None:
        raise ValueError("give either base_url (one server) or base_urls (several), not both")
    if base_urls is None:
        if base_url is None:
            raise ValueError("give the server's address: HarnessEnv(url), or HarnessEnv(base_urls=[url, ...]) for several")
        urls, name = [base_url], "base_url"
    elif isinstance(base_urls, (str, bytes)):
        raise ValueError("base_urls is a list of addresses; for one server pass it as HarnessEnv(url)")
    else:
        urls, name = list(base_urls), "base_urls"
        if not urls:
            raise ValueError("base_urls is empty: list at least one server address")
    out: list[str] = []
    for i, url in enumerate(urls):
        where = name if name == "base_url" else f"base_urls[{i}]"
        if not isinstance(url, str):
            raise ValueError(f"{where} is a {type(url).__name__}, not an address: give strings like 'http://host:8100'")
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL:
            parsed = None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"{where} is not an http(s) address: {redacted(url)!r} (give one like 'http://host:8100')")
        url = url.rstrip("/")
        if url in out:
            raise ValueError(f"{where} is listed twice: {redacted(url)!r} (each server once)")
        out.append(url)
    return out


@dataclass
class Server:
    url: str
    index: int
    in_flight: int = 0  # rollouts this client has running there (calls, and jobs not yet seen ended)
    refusals: int = 0  # in a row
    rest_until: float = 0.0


class Servers:
    def __init__(self, urls: Sequence[str]) -> None:
        self._servers = [Server(url, i) for i, url in enumerate(urls)]
        self._by_url = {s.url: s for s in self._servers}
        self._turn = 0  # the next in turn among equals
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._open: dict[str, str] = {}  # job id -> the server it is counted in flight at, until seen ended
        self._lock = threading.Lock()

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self._servers]

    def take(self, tried: Collection[str], count: bool = True) -> str | None:
        """The server to try next, of those not in `tried` (None: no server left). One resting
        after a refusal comes after every other; then the fewest in flight; then the next in turn.
        `count`: counted in flight at once, so callers choosing at the same moment spread out
        (give it back with `release`)."""
        with self._lock:
            now = time.monotonic()
            left = [s for s in self._servers if s.url not in tried]
            if not left:
                return None
            n = len(self._servers)
            best = min(left, key=lambda s: (max(s.rest_until - now, 0.0), s.in_flight, (s.index - self._turn) % n))
            if count:
                best.in_flight += 1
                self._turn = (best.index + 1) % n
            return best.url

    def release(self, url: str) -> None:
        with self._lock:
            server = self._by_url[url]
            server.in_flight = max(0, server.in_flight - 1)

    def refused(self, url: str) -> None:
        """It answered busy, or could not be reached: let it rest before it is asked first again."""
        with self._lock:
            server = self._by_url[url]
            server.refusals += 1
            server.rest_until = time.monotonic() + min(REST_MAX_S, REST_START_S * 2 ** (server.refusals - 1))

    def reached(self, url: str) -> None:
        with self._lock:
            server = self._by_url[url]
            server.refusals, server.rest_until = 0, 0.0

    def own(self, rollout_id: str, url: str, counted: bool = False) -> None:
        """`url` owns the rollout. `counted`: `take` counted it in flight there, and it stays
        counted until seen ended; a job named again (an idempotent repeat) stays counted once."""
        with self._lock:
            self._owners[rollout_id] = url
            self._owners.move_to_end(rollout_id)
            if counted:
                if rollout_id in self._open:
                    self._by_url[url].in_flight = max(0, self._by_url[url].in_flight - 1)
                else:
                    self._open[rollout_id] = url
            while len(self._owners) > MAX_OWNERS:
                self._close(self._owners.popitem(last=False)[0])

    def owner(self, rollout_id: str) -> str | None:
        with self._lock:
            return self._owners.get(rollout_id)

    def ended(self, rollout_id: str) -> None:
        """The job ended (seen in a status, a wait or its events): it is no longer in flight."""
        with self._lock:
            self._close(rollout_id)

    def _close(self, rollout_id: str) -> None:
        url = self._open.pop(rollout_id, None)
        if url is not None:
            server = self._by_url[url]
            server.in_flight = max(0, server.in_flight - 1)


def routed_steps(servers: Servers, method: str, path: str, kw: dict[str, Any], *, count: bool = False, only: str | None = None) -> Steps:
    """One call, on the best server that takes it (`only`: on that one); returns (server, response).
    A server that answers busy (429) or is never reached is left for the next. When every server
    refused, the caller gets the last refusal, as from one server; when none was reached, the
    servers are tried again 0.5, 1, 2 and 4 s later, then the connection error is raised. Other
    errors are raised as they come (a call that may have reached a server is not repeated)."""
    for attempt in range(CONNECT_RETRIES + 1):
        tried: set[str] = set(servers.urls) - {only} if only is not None else set()
        busy: HarnessEnvClientError | None = None
        unreachable: Exception | None = None
        while (url := servers.take(tried, count)) is not None:
            tried.add(url)
            try:
                resp = yield Call(url, method, path, kw)
            except NEVER_REACHED as e:
                servers.refused(url)
                unreachable = e
                continue
            finally:
                if count:
                    servers.release(url)
            if resp.status_code == BUSY:
                servers.refused(url)
                busy = error_of(resp)
                continue
            servers.reached(url)
            raise_for(resp)
            return url, resp
        if busy is not None:
            raise busy
        assert unreachable is not None
        if attempt == CONNECT_RETRIES:
            raise unreachable
        yield Pause(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def locate_steps(servers: Servers, rollout_id: str) -> Steps:
    """The server that owns a rollout: the one this client gave it to, else the first that knows
    its id (each asked in turn; on a shared store, any). None knows it: their 404; one could not
    be reached: its error (the rollout may be there). A string that cannot be an id: 404 at once."""
    if not is_rollout_id(rollout_id):
        raise HarnessEnvClientError(
            404, f"no rollout with id {str(rollout_id)[:80]!r}: a rollout id is up to 32 hexadecimal digits, as run_rollout's result or submit gave it"
        )
    if (url := servers.owner(rollout_id)) is not None:
        return url
    if len(servers.urls) == 1:
        return servers.urls[0]
    missing: httpx.Response | None = None
    unreachable: Exception | None = None
    for url in servers.urls:
        try:
            resp = yield Call(url, "GET", f"/rollouts/{rollout_id}")
        except httpx.TransportError as e:
            unreachable = e
            continue
        if resp.status_code == 404:
            missing = resp
            continue
        raise_for(resp)
        servers.own(rollout_id, url)
        return url
    if unreachable is not None:
        raise unreachable
    assert missing is not None
    raise error_of(missing)
