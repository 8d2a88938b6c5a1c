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
    """Tell every server, even past one that fails (a server left syncing would hold its rollouts'
    model calls); returns the last one's answer ({"version": ..., "syncing": ...}); then raises
    the first failure, naming every server that missed the news."""
    body = {k: v for k, v in (("version", version), ("syncing", syncing)) if v is not None}
    state: dict[str, Any] = {}
    failed: list[tuple[str, Exception]] = []
    for url in servers.urls:
        try:
            _, resp = yield from routed_steps(servers, "PUT", "/policy/weights", {"json": body}, only=url)
        except Exception as e:  # told to the others first, raised below
            failed.append((url, e))
            continue
        state = resp.json()
    if failed:
        first = failed[0][1]
        first.add_note(f"every other server was told; missed: {', '.join(url for url, _ in failed)}")
        raise first
    return state
