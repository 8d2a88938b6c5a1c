"""Pure helpers several harnesses' config builders share: a caller's extra config merged over
ours, a list of ours a caller may add to but not lift, the proxy's root for clients that add
their API's own path. Names no harness: each envs/<name>/config.py imports what it uses."""

from __future__ import annotations

import copy
from typing import Any


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` over `base` (objects merged key by key, anything else replaced); neither is changed."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def keep_listed(config: dict[str, Any], path: tuple[str, ...], ours: tuple[str, ...]) -> dict[str, Any]:
    """`config` (deep-merged) with our entries first in the list at `path`, then the caller's: a
    merged list replaces ours, and a caller's deny list must add to it, never lift what we deny
    (a list or a parent that is not one is dropped)."""
    *parents, last = path
    node = config
    for key in parents:
        if not isinstance(node.get(key), dict):
            node[key] = {}  # a caller's non-object here would take our list with it
        node = node[key]
    given = node.get(last)
    given = given if isinstance(given, list) else []
    node[last] = [*ours, *(t for t in given if t not in ours)]
    return config


def proxy_root(proxy_base_url: str) -> str:
    """The proxy's root: clients that add their API's path themselves (`/v1/messages`,
    `/v1beta/models/...`) are given it without the `/v1`."""
    return proxy_base_url.rstrip("/").removesuffix("/v1")
