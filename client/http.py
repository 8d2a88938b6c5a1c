"""The remote client: run rollouts on harness-env servers from a trainer host.

Depends only on harness_env.models and httpx. Timeouts are sized for long rollouts. `run_rollout` is one
call (retried only when it never reached a server: connection refused, DNS). Jobs are durable
(client/jobs.py): `submit` carries an idempotency key, so it is retried after any drop without
running anything twice; `wait` long-polls and reconnects; `run_many` submits then waits, riding
out a busy server (backoff) and dropped connections instead of losing rollouts.

Several base URLs (replicas with no load balancer in front, client/servers.py): each rollout goes
to the server with the fewest this client has in flight, a busy or unreachable one passes it on,
and a job's calls go to the server that took it. Both clients drive the same steps; only their
I/O differs.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, ClassVar
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from harness_env.client.jobs import REFUSED_OR_LOST, EventFollower, cancel_steps, failed, get_steps, rollout_steps, submit_steps, wait_steps
from harness_env.client.listing import list_steps
from harness_env.client.servers import Servers, locate_steps, routed_steps, server_urls
from harness_env.client.steps import DEFAULT_RECONNECT_FOR_S, Call, Driver, HarnessEnvClientError, Patience, Steps, invalid_request
from harness_env.client.weights import weight_steps
from harness_env.models import DatasetTaskInfo, Detail, HarnessInfo, JobEnd, PhaseEvent, RolloutAccepted, RolloutArgs, RolloutJob, RolloutResult

DEFAULT_TIMEOUT_S = 3600.0
EVENTS_TIMEOUT = httpx.Timeout(10.0, read=60.0)  # the server sends a keep-alive every 15 s: a silent minute is a dead connection


def _args(args: RolloutArgs | dict[str, Any] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    if isinstance(args, RolloutArgs):
        data = args.model_dump(mode="json")
        data["api_key"] = args.api_key.get_secret_value()
    else:
        data = dict(args or {})
    data.update(kwargs)
    # Validate locally first: a typo fails here, not after a round trip, as the server would say it.
    try:
        checked = RolloutArgs.model_validate(data)
    except ValidationError as e:
        raise HarnessEnvClientError(422, invalid_request(e.errors(include_input=False, include_url=False))) from None
    out = checked.model_dump(mode="json", exclude_defaults=True)
    out["instruction"] = checked.instruction
    if checked.api_key.get_secret_value():
        out["api_key"] = checked.api_key.get_secret_value()
    return out


def _tasks_call(dataset: str, split: str | None, harness: str | None) -> tuple[str, dict[str, str]]:
    """The route and parameters of a task listing: a named harness's own (GET /<harness>/tasks),
    else the server's generic one (GET /tasks: the first registered harness that lists tasks)."""
    params = {"dataset": dataset, **({"split": split} if split else {})}
    return (f"/{quote(harness, safe='')}/tasks" if harness else "/tasks"), params


SPACE_DOMAIN = ".hf.space"  # a Hugging Face Space's own address
TOKEN_HEADER = "x-harness-env-token"  # the server's token beside a Space's Authorization (server/auth.py)


def is_space_url(base_url: str) -> bool:
    return (httpx.URL(base_url).host or "").endswith(SPACE_DOMAIN)


def stored_hf_token() -> str | None:
    """The token huggingface_hub stores for a logged-in user (HF_TOKEN, `hf auth login`), if it is installed."""
    try:
        from huggingface_hub import get_token
    except ImportError:
        return None
    return get_token()


def auth_headers(base_url: str, token: str | None, hf_token: str | None, headers: dict[str, str] | None) -> dict[str, str]:
    """The headers every call carries. A private Space's front door wants a Hugging Face token in
    Authorization; the server's own token then goes in X-Harness-Env-Token. On a Space address the
    stored Hugging Face token is used unless `hf_token` is given (`""`: none); it is sent to
    Space addresses only. `headers` are added last (they win)."""
    if hf_token is None and is_space_url(base_url):
        hf_token = stored_hf_token()
    out: dict[str, str] = {}
    if hf_token:
        out["authorization"] = f"Bearer {hf_token}"
        if token:
            out[TOKEN_HEADER] = token
    elif token:
        out["authorization"] = f"Bearer {token}"
    out.update({k.lower(): v for k, v in (headers or {}).items()})
    return out


def _client_options(base_url: str, token: str | None, hf_token: str | None, headers: dict[str, str] | None, timeout: float) -> dict[str, Any]:
    """httpx client keywords shared by the sync and async clients (one httpx client per server:
    the headers are each address's own, a Space's Hugging Face token going to Space addresses only)."""
    return {
        "base_url": base_url,
        "headers": auth_headers(base_url, token, hf_token, headers),
        "timeout": httpx.Timeout(timeout, connect=10.0),
        "limits": httpx.Limits(max_connections=None, max_keepalive_connections=64),
    }


class _Common:
    """What both clients hold: their servers, an httpx client for each, and which one owns each rollout."""

    _http: ClassVar[type[httpx.Client] | type[httpx.AsyncClient]]  # each client's own kind

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        *,
        base_urls: Sequence[str] | None = None,
        hf_token: str | None = None,
        headers: dict[str, str] | None = None,
        reconnect_for_s: float = DEFAULT_RECONNECT_FOR_S,
    ) -> None:
        """`base_url`: the server; or `base_urls`: several (each rollout to the one with the fewest
        in flight; a busy or unreachable one passes it on). `token`: the server's HARNESS_ENV_TOKEN
        (the same for every server); `hf_token`: for a private Hugging Face Space (default: the
        stored one, on a Space address only); `headers`: sent with every call; `reconnect_for_s`:
        how long a job call keeps reconnecting to an unreachable server."""
        urls = server_urls(base_url, base_urls)
        self.base_urls = urls
        self.base_url = urls[0]  # the one server (with several: the first)
        self.reconnect_for_s = reconnect_for_s
        self._servers = Servers(urls)
        self._clients = {url: self._http(**_client_options(url, token, hf_token, headers, timeout)) for url in urls}

    def server_of(self, rollout_id: str) -> str | None:
        """The base URL of the server that ran or holds a rollout this client ran, submitted,
        looked up or listed (None: not known here)."""
        return self._servers.owner(rollout_id)


class AsyncHarnessEnv(_Common):
    """`async with AsyncHarnessEnv(url) as env: result = await env.run_rollout(instruction=..., ...)`;
    several servers: `AsyncHarnessEnv(base_urls=[url1, url2])`."""

    _http = httpx.AsyncClient
    _clients: dict[str, httpx.AsyncClient]

    async def __aenter__(self) -> AsyncHarnessEnv:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()

    async def _drive(self, steps: Steps) -> Any:
        """Run a call's steps (client/jobs.py) with this client's httpx clients."""
        driver = Driver(steps)
        try:
            while (step := driver.next()) is not None:
                if isinstance(step, Call):
                    try:
                        driver.reply = await self._clients[step.server].request(step.method, step.path, **step.kw)
                    except httpx.TransportError as e:
                        driver.error = e
                else:
                    await asyncio.sleep(step.seconds)
            return driver.value
        finally:
            steps.close()  # a call cancelled mid-way gives back what it counted in flight

    async def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """A call that is not a rollout's (health, catalogs): whichever server answers."""
        return (await self._drive(routed_steps(self._servers, method, path, kw)))[1]

    async def run_rollout(self, args: RolloutArgs | dict[str, Any] | None = None, **kwargs: Any) -> RolloutResult:
        """One rollout, waited for. With several servers: on the one with the fewest in flight,
        the next when it is busy or unreachable; `server_of(result.rollout_id)` says which ran it.
        All busy: HarnessEnvClientError 429."""
        return await self._drive(rollout_steps(self._servers, _args(args, kwargs)))

    async def submit(
        self, args: RolloutArgs | dict[str, Any] | None = None, *, idempotency_key: str | None = None, retry_busy: bool = False, **kwargs: Any
    ) -> RolloutAccepted:
        """Submit a rollout; it runs on the server whether or not this client stays. Retried after
        a dropped connection with the same idempotency key (one is made if not given), so it never
        runs twice; every server busy raises HarnessEnvClientError 429 unless `retry_busy`."""
        steps = submit_steps(
            self._servers, _args(args, kwargs), idempotency_key or uuid.uuid4().hex, retry_busy=retry_busy, patience=Patience(self.reconnect_for_s)
        )
        return await self._drive(steps)

    async def get(self, rollout_id: str, detail: Detail = "summary", wait_s: float = 0.0) -> RolloutJob:
        """A rollout's status, phases and, once it ended, its summary (detail="full": its whole
        result too); `wait_s` (at most 60): wait that long for it to end first."""
        return await self._drive(get_steps(self._servers, rollout_id, detail, wait_s))

    async def wait(self, rollout_id: str, timeout: float | None = None) -> RolloutResult:
        """The rollout's result once it ended (long polls, reconnecting after any drop);
        TimeoutError after `timeout` seconds (None: no limit)."""
        return await self._drive(wait_steps(self._servers, rollout_id, timeout, Patience(self.reconnect_for_s)))

    async def cancel(self, rollout_id: str) -> RolloutJob:
        return await self._drive(cancel_steps(self._servers, rollout_id))

    async def list_rollouts(self, **filters: Any) -> dict[str, Any]:
        """GET /rollouts: status=[...], task_id, harness, limit, before (a page's next_cursor);
        with several servers, their listings merged, newest first."""
        return await self._drive(list_steps(self._servers, filters))

    async def events(self, rollout_id: str) -> AsyncIterator[PhaseEvent | JobEnd]:
        """The rollout's phase events, from the first, live, then a JobEnd; after a dropped
        connection it reconnects and resumes where it was (Last-Event-ID)."""
        client = self._clients[await self._drive(locate_steps(self._servers, rollout_id))]
        follower = EventFollower(self._servers, rollout_id, Patience(self.reconnect_for_s))
        while True:
            try:
                async with client.stream("GET", follower.path, headers=follower.headers(), timeout=EVENTS_TIMEOUT) as r:
                    if r.status_code >= 400:
                        await r.aread()
                        await asyncio.sleep(follower.refused(r))
                        continue
                    follower.connected()
                    async for line in r.aiter_lines():
                        if (item := follower.feed(line)) is not None:
                            yield item
                            if isinstance(item, JobEnd):
                                return
            except httpx.TransportError as e:
                await asyncio.sleep(follower.dropped(e))

    async def run_many(self, requests: Iterable[RolloutArgs | dict[str, Any]], concurrency: int = 8) -> AsyncIterator[RolloutResult]:
        """Keep `concurrency` rollouts in flight; yield each result as it finishes. Each is
        submitted (busy servers are waited out with backoff) then waited for, reconnecting after
        a drop, so none is lost and none runs twice. A rollout that cannot be submitted (bad
        arguments) or whose server stays unreachable becomes a result with `error` (never an
        exception mid-batch)."""
        sem = asyncio.Semaphore(concurrency)

        async def one(req: RolloutArgs | dict[str, Any]) -> RolloutResult:
            async with sem:
                try:
                    accepted = await self.submit(req, retry_busy=True)
                    return await self.wait(accepted.rollout_id)
                except REFUSED_OR_LOST as e:
                    return failed(req, e)

        tasks = [asyncio.ensure_future(one(r)) for r in requests]
        try:
            for fut in asyncio.as_completed(tasks):
                yield await fut
        finally:
            for t in tasks:
                t.cancel()

    async def list_harnesses(self) -> list[HarnessInfo]:
        return [HarnessInfo.model_validate(h) for h in (await self._call("GET", "/harnesses")).json()]

    async def list_tasks(self, dataset: str = "", split: str | None = None, harness: str | None = None) -> list[DatasetTaskInfo]:
        """The tasks of `dataset` as harness `harness` lists them (relative to its tasks root on
        the server, e.g. Harbor's $HARNESS_ENV_HARBOR_TASKS_DIR; empty: that root), in the order
        its task index counts them. `harness` None: the server's first registered harness that
        lists tasks (Harbor, of the built-in ones)."""
        path, params = _tasks_call(dataset, split, harness)
        resp = await self._call("GET", path, params=params)
        return [DatasetTaskInfo.model_validate(t) for t in resp.json()]

    async def health(self) -> dict[str, Any]:
        """The health of a server (with several: the first that answers)."""
        return (await self._call("GET", "/health")).json()

    async def set_weights(self, version: int | None = None, *, syncing: bool | None = None) -> dict[str, Any]:
        """Tell every server the policy's weight version, and begin (`syncing=True`) or end a
        weight sync (client/weights.py)."""
        return await self._drive(weight_steps(self._servers, version, syncing))


class HarnessEnv(_Common):
    """The synchronous client: `HarnessEnv(url).run_rollout(instruction=..., endpoint="vllm")`;
    several servers: `HarnessEnv(base_urls=[url1, url2])`."""

    _http = httpx.Client
    _clients: dict[str, httpx.Client]

    def __enter__(self) -> HarnessEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()

    def _drive(self, steps: Steps) -> Any:
        driver = Driver(steps)
        try:
            while (step := driver.next()) is not None:
                if isinstance(step, Call):
                    try:
                        driver.reply = self._clients[step.server].request(step.method, step.path, **step.kw)
                    except httpx.TransportError as e:
                        driver.error = e
                else:
                    time.sleep(step.seconds)
            return driver.value
        finally:
            steps.close()

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self._drive(routed_steps(self._servers, method, path, kw))[1]

    def run_rollout(self, args: RolloutArgs | dict[str, Any] | None = None, **kwargs: Any) -> RolloutResult:
        """As AsyncHarnessEnv.run_rollout."""
        return self._drive(rollout_steps(self._servers, _args(args, kwargs)))

    def submit(
        self, args: RolloutArgs | dict[str, Any] | None = None, *, idempotency_key: str | None = None, retry_busy: bool = False, **kwargs: Any
    ) -> RolloutAccepted:
        """As AsyncHarnessEnv.submit."""
        steps = submit_steps(
            self._servers, _args(args, kwargs), idempotency_key or uuid.uuid4().hex, retry_busy=retry_busy, patience=Patience(self.reconnect_for_s)
        )
        return self._drive(steps)

    def get(self, rollout_id: str, detail: Detail = "summary", wait_s: float = 0.0) -> RolloutJob:
        return self._drive(get_steps(self._servers, rollout_id, detail, wait_s))

    def wait(self, rollout_id: str, timeout: float | None = None) -> RolloutResult:
        return self._drive(wait_steps(self._servers, rollout_id, timeout, Patience(self.reconnect_for_s)))

    def cancel(self, rollout_id: str) -> RolloutJob:
        return self._drive(cancel_steps(self._servers, rollout_id))

    def list_rollouts(self, **filters: Any) -> dict[str, Any]:
        """As AsyncHarnessEnv.list_rollouts."""
        return self._drive(list_steps(self._servers, filters))

    def events(self, rollout_id: str) -> Iterator[PhaseEvent | JobEnd]:
        """As AsyncHarnessEnv.events."""
        client = self._clients[self._drive(locate_steps(self._servers, rollout_id))]
        follower = EventFollower(self._servers, rollout_id, Patience(self.reconnect_for_s))
        while True:
            try:
                with client.stream("GET", follower.path, headers=follower.headers(), timeout=EVENTS_TIMEOUT) as r:
                    if r.status_code >= 400:
                        r.read()
                        time.sleep(follower.refused(r))
                        continue
                    follower.connected()
                    for line in r.iter_lines():
                        if (item := follower.feed(line)) is not None:
                            yield item
                            if isinstance(item, JobEnd):
                                return
            except httpx.TransportError as e:
                time.sleep(follower.dropped(e))

    def run_many(self, requests: Iterable[RolloutArgs | dict[str, Any]], concurrency: int = 8) -> Iterator[RolloutResult]:
        """As AsyncHarnessEnv.run_many, with threads."""

        def one(req: RolloutArgs | dict[str, Any]) -> RolloutResult:
            try:
                return self.wait(self.submit(req, retry_busy=True).rollout_id)
            except REFUSED_OR_LOST as e:
                return failed(req, e)

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            futures = [pool.submit(one, r) for r in requests]
            for fut in as_completed(futures):
                yield fut.result()

    def list_harnesses(self) -> list[HarnessInfo]:
        return [HarnessInfo.model_validate(h) for h in self._call("GET", "/harnesses").json()]

    def list_tasks(self, dataset: str = "", split: str | None = None, harness: str | None = None) -> list[DatasetTaskInfo]:
        """As AsyncHarnessEnv.list_tasks."""
        path, params = _tasks_call(dataset, split, harness)
        resp = self._call("GET", path, params=params)
        return [DatasetTaskInfo.model_validate(t) for t in resp.json()]

    def health(self) -> dict[str, Any]:
        """As AsyncHarnessEnv.health."""
        return self._call("GET", "/health").json()

    def set_weights(self, version: int | None = None, *, syncing: bool | None = None) -> dict[str, Any]:
        """As AsyncHarnessEnv.set_weights."""
        return self._drive(weight_steps(self._servers, version, syncing))
