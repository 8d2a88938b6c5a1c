"""GET /rollouts over several servers: one listing, newest first, paged with one cursor.

Each server's page comes newest first; the pages are merged by creation time, keeping each
server's own order, so what a page shows of a server is a prefix of what it answered. The cursor
records, for each server not yet exhausted, its own cursor and how many of that page were shown.
It names servers by position, with a fingerprint of the list (a cursor of other servers is
refused, never misread), and holds no address. Replicas sharing one store list the same jobs:
each is shown once. With one server the listing is that server's, cursor and all.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from harness_env.client.servers import Servers, routed_steps
from harness_env.client.steps import Steps
from harness_env.models import MAX_LIST_LIMIT

DEFAULT_LIMIT = 50  # the server's own page size when none is asked for
CURSOR_PREFIX = "servers."

Positions = dict[int, tuple[str | None, int]]  # server index -> (its own cursor, items of that page already shown)


def list_steps(servers: Servers, filters: dict[str, Any]) -> Steps:
    """The listing's page as GET /rollouts answers it: {"items": [...], "next_cursor": ...}."""
    params = {k: v for k, v in filters.items() if v is not None}
    urls = servers.urls
    if len(urls) == 1:
        _, resp = yield from routed_steps(servers, "GET", "/rollouts", {"params": params}, only=urls[0])
        return resp.json()
    limit = params.pop("limit", DEFAULT_LIMIT)
    if not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
        raise ValueError(f"limit must be a whole number from 1 to {MAX_LIST_LIMIT}, not {limit!r}")
    positions = read_cursor(params.pop("before", None), urls)
    pages: dict[int, list[dict[str, Any]]] = {}
    next_cursors: dict[int, str | None] = {}
    for i, (before, skip) in positions.items():
        query = {**params, "limit": min(MAX_LIST_LIMIT, skip + limit), **({"before": before} if before else {})}
        _, resp = yield from routed_steps(servers, "GET", "/rollouts", {"params": query}, only=urls[i])
        page = resp.json()
        for item in page["items"]:
            servers.own(item["rollout_id"], urls[i])  # its later calls go where it is listed
        pages[i], next_cursors[i] = page["items"][skip:], page.get("next_cursor")
    shown, items = merge_pages(pages, limit)
    after: Positions = {}
    for i, (before, skip) in positions.items():
        if shown[i] < len(pages[i]):
            after[i] = (before, skip + shown[i])
        elif next_cursors[i]:
            after[i] = (next_cursors[i], 0)
    return {"items": items, "next_cursor": write_cursor(after, urls) if after else None}


def merge_pages(pages: dict[int, list[dict[str, Any]]], limit: int) -> tuple[Counter[int], list[dict[str, Any]]]:
    """Up to `limit` items, newest first, each rollout once; how many of each server's were used."""
    stream: Iterator[tuple[int, dict[str, Any]]] = heapq.merge(
        *([(i, item) for item in items] for i, items in pages.items()), key=lambda pair: -pair[1]["created_at"]
    )
    used: Counter[int] = Counter()
    seen: set[str] = set()
    items: list[dict[str, Any]] = []
    for i, item in stream:
        duplicate = item["rollout_id"] in seen
        if len(items) == limit and not duplicate:
            break  # the page is full; a copy of its last item (a shared store) is used up with it
        used[i] += 1
        if not duplicate:
            seen.add(item["rollout_id"])
            items.append(item)
    return used, items


def _fingerprint(urls: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(urls).encode()).hexdigest()[:12]


def write_cursor(positions: Positions, urls: Sequence[str]) -> str:
    data = {"f": _fingerprint(urls), "p": {str(i): [before, skip] for i, (before, skip) in positions.items()}}
    return CURSOR_PREFIX + base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")


def read_cursor(cursor: str | None, urls: Sequence[str]) -> Positions:
    """Where each server's listing stands; ValueError for a cursor this client did not make."""
    if cursor is None:
        return {i: (None, 0) for i in range(len(urls))}
    wrong = ValueError(
        f"before={str(cursor)[:40]!r} is not a next_cursor of this client's listing: pass the next_cursor list_rollouts answered, with the same base_urls"
    )
    if not isinstance(cursor, str) or not cursor.startswith(CURSOR_PREFIX):
        raise wrong
    try:
        encoded = cursor[len(CURSOR_PREFIX) :]
        data = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
        positions = {int(i): (before, int(skip)) for i, (before, skip) in data["p"].items()}
    except (ValueError, binascii.Error, KeyError, TypeError, AttributeError):
        raise wrong from None
    if data.get("f") != _fingerprint(urls) or any(not 0 <= i < len(urls) or skip < 0 for i, (_, skip) in positions.items()):
        raise wrong
    return positions
