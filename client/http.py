"""The remote client: run rollouts on a harness-env server from a trainer host.

Depends only on models.py and httpx. Timeouts are sized for long rollouts; a call is retried (with
backoff) only when it never reached the server (connection refused, DNS), never once the server
may have started the rollout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import httpx

from harness_env.models import DatasetTaskInfo, HarnessInfo, RolloutArgs, RolloutResult

DEFAULT_TIMEOUT_S = 3600.0
CONNECT_RETRIES = 4


class HarnessEnvClientError(Exception):
    """The server refused the call: bad arguments (status 422), busy (429), auth (401), ..."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def _args(args: RolloutArgs | dict[str, Any] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    if isinstance(args, RolloutArgs):
        data = args.model_dump(mode="json")
        data["api_key"] = args.api_key.get_secret_value()
    else:
        data = dict(args or {})
    data.update(kwargs)
    # Validate locally first: a typo fails here, with pydantic's message, not after a round trip.
    checked = RolloutArgs.model_validate(data)
    out = checked.model_dump(mode="json", exclude_defaults=True)
    out["instruction"] = checked.instruction
    if checked.api_key.get_secret_value():
        out["api_key"] = checked.api_key.get_secret_value()
    return out


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        body = resp.json()
        detail = body.get("detail") or (body.get("error") or {}).get("message") or resp.text
    except (ValueError, AttributeError):
        detail = resp.text
    raise HarnessEnvClientError(resp.status_code, detail if isinstance(detail, str) else str(detail))


def _failed(req: RolloutArgs | dict[str, Any], e: Exception) -> RolloutResult:
    """A call the server refused or never answered, as data (run_many never raises mid-batch)."""
    task_id = req.task_id if isinstance(req, RolloutArgs) else req.get("task_id")
    return RolloutResult(task_id=task_id or None, error=f"request failed: {e}", error_kind="internal")


def _tasks_params(dataset: str, split: str | None) -> dict[str, str]:
    return {"dataset": dataset, **({"split": split} if split else {})}


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


def _client_options(base_url: str, token: str | None, hf_token: str | None, headers: dict[str, str] | None,
                    timeout: float) -> dict[str, Any]:
    """httpx client keywords shared by the sync and async clients."""
    return {
        "base_url": base_url,
        "headers": auth_headers(base_url, token, hf_token, headers),
        "timeout": httpx.Timeout(timeout, connect=10.0),
        "limits": httpx.Limits(max_connections=None, max_keepalive_connections=64),
    }


class AsyncHarnessEnv:
    """`async with AsyncHarnessEnv(url) as env: result = await env.run_rollout(instruction=..., ...)`"""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_S, *,
                 hf_token: str | None = None, headers: dict[str, str] | None = None) -> None:
        """`token`: the server's HARNESS_ENV_TOKEN; `hf_token`: for a private Hugging Face Space
        (default: the stored one, on a Space address only); `headers`: sent with every call."""
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(**_client_options(self.base_url, token, hf_token, headers, timeout))

    async def __aenter__(self) -> AsyncHarnessEnv:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        for attempt in range(CONNECT_RETRIES + 1):
            try:
                resp = await self._client.request(method, path, **kw)
            except httpx.ConnectError:  # never reached the server: safe to retry
                if attempt == CONNECT_RETRIES:
                    raise
                await asyncio.sleep(0.5 * 2**attempt)
                continue
            _raise_for(resp)
            return resp
        raise AssertionError("unreachable")

    async def run_rollout(self, args: RolloutArgs | dict[str, Any] | None = None, **kwargs: Any) -> RolloutResult:
        resp = await self._request("POST", "/rollout", json=_args(args, kwargs))
        return RolloutResult.model_validate_json(resp.content)

    async def run_many(self, requests: Iterable[RolloutArgs | dict[str, Any]], concurrency: int = 8) -> AsyncIterator[RolloutResult]:
        """Keep `concurrency` rollouts in flight; yield each result as it finishes. A call the
        server refused becomes a result with `error` (never an exception mid-batch)."""
        sem = asyncio.Semaphore(concurrency)

        async def one(req: RolloutArgs | dict[str, Any]) -> RolloutResult:
            async with sem:
                try:
                    return await self.run_rollout(req)
                except (HarnessEnvClientError, httpx.HTTPError) as e:
                    return _failed(req, e)

        tasks = [asyncio.ensure_future(one(r)) for r in requests]
        try:
            for fut in asyncio.as_completed(tasks):
                yield await fut
        finally:
            for t in tasks:
                t.cancel()

    async def list_harnesses(self) -> list[HarnessInfo]:
        resp = await self._request("GET", "/harnesses")
        return [HarnessInfo.model_validate(h) for h in resp.json()]

    async def list_tasks(self, dataset: str = "", split: str | None = None) -> list[DatasetTaskInfo]:
        """The Harbor tasks of `dataset` (relative to the server's $HARNESS_ENV_HARBOR_TASKS_DIR;
        empty: that directory), in the order harbor.task_index counts them."""
        resp = await self._request("GET", "/harbor/tasks", params=_tasks_params(dataset, split))
        return [DatasetTaskInfo.model_validate(t) for t in resp.json()]

    async def health(self) -> dict[str, Any]:
        return (await self._request("GET", "/health")).json()


class HarnessEnv:
    """The synchronous client: `HarnessEnv(url).run_rollout(instruction=..., endpoint="vllm")`."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_S, *,
                 hf_token: str | None = None, headers: dict[str, str] | None = None) -> None:
        """`token`: the server's HARNESS_ENV_TOKEN; `hf_token`: for a private Hugging Face Space
        (default: the stored one, on a Space address only); `headers`: sent with every call."""
        self.base_url = base_url.rstrip("/")
        self._client = httpx.Client(**_client_options(self.base_url, token, hf_token, headers, timeout))

    def __enter__(self) -> HarnessEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        for attempt in range(CONNECT_RETRIES + 1):
            try:
                resp = self._client.request(method, path, **kw)
            except httpx.ConnectError:
                if attempt == CONNECT_RETRIES:
                    raise
                time.sleep(0.5 * 2**attempt)
                continue
            _raise_for(resp)
            return resp
        raise AssertionError("unreachable")

    def run_rollout(self, args: RolloutArgs | dict[str, Any] | None = None, **kwargs: Any) -> RolloutResult:
        resp = self._request("POST", "/rollout", json=_args(args, kwargs))
        return RolloutResult.model_validate_json(resp.content)

    def run_many(self, requests: Iterable[RolloutArgs | dict[str, Any]], concurrency: int = 8) -> Iterator[RolloutResult]:
        """Keep `concurrency` rollouts in flight (threads); yield results as they finish."""

        def one(req: RolloutArgs | dict[str, Any]) -> RolloutResult:
            try:
                return self.run_rollout(req)
            except (HarnessEnvClientError, httpx.HTTPError) as e:
                return _failed(req, e)

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            futures = [pool.submit(one, r) for r in requests]
            for fut in as_completed(futures):
                yield fut.result()

    def list_harnesses(self) -> list[HarnessInfo]:
        return [HarnessInfo.model_validate(h) for h in self._request("GET", "/harnesses").json()]

    def list_tasks(self, dataset: str = "", split: str | None = None) -> list[DatasetTaskInfo]:
        """The Harbor tasks of `dataset` (relative to the server's $HARNESS_ENV_HARBOR_TASKS_DIR;
        empty: that directory), in the order harbor.task_index counts them."""
        resp = self._request("GET", "/harbor/tasks", params=_tasks_params(dataset, split))
        return [DatasetTaskInfo.model_validate(t) for t in resp.json()]

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/health").json()
