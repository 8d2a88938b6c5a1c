"""PUT /policy/weights on every server (server/weights.py): the policy's weight version, and weight
syncs. Each server's capture proxy keeps its own, so a trainer with several servers tells them all.

A trainer syncing weights: `set_weights(syncing=True)` before the engine loads new weights (new
model calls wait), `set_weights(version=n, syncing=False)` after; calls in flight are never aborted.
"""

from __future__ import annotations

from typing import Any

from harness_env.client.servers import Servers, routed_steps
from harness_env.client.steps import Steps


def weight_steps(servers: Servers, version: int | None, syncing: bool | None) -> Steps:
    """Tell every server; returns the last one's answer ({"version": ..., "syncing": ...})."""
    body = {k: v for k, v in (("version", version), ("syncing", syncing)) if v is not None}
    state: dict[str, Any] = {}
    for url in servers.urls:
        _, resp = yield from routed_steps(servers, "PUT", "/policy/weights", {"json": body}, only=url)
        state = resp.json()
    return state
