"""Storing a RolloutResult compactly: each turn's new tokens and messages once.

A turn's prompt repeats the whole conversation so far, so storing every turn whole grows with the
square of the conversation. A turn that continues its parent (the turn graph) is stored as only
what it adds: the prompt tokens after the parent's prompt + completion, and the request messages
after the parent's. `unpack` rebuilds the exact RolloutResult. Imports only the wire types, so a
trainer host can read stored rollouts with the client install.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness_env.models import RolloutResult, Turn

FORMAT = "harness-env.compact/1"
# The training rows' one layout: `harness-env run --rows-out` and the export's `rows` table.
ROW_COLUMNS = (
    "task_id",
    "attempt",
    "rollout_id",
    "branch",
    "turn_indices",
    "prompt_ids",
    "completion_ids",
    "loss_mask",
    "logprobs",
    "reward",
    "trainable",
    "untrainable_reason",
    "mask_sample",
    "stale",
)


def row_records(result: RolloutResult, *, task_id: str | None = None, attempt: int = 0) -> list[dict[str, Any]]:
    """`result`'s training rows (one per branch of its turn graph) as flat records of ROW_COLUMNS:
    the branch's first prompt apart from what follows it, loss mask and logprobs aligned with
    `completion_ids` (1 / the logprob on sampled tokens, 0 on tool results and user text).
    `task_id`: the result's own unless given (the export names tasks by their directory)."""
    out = []
    for row in result.training_rows():
        p = row.prompt_length
        out.append(
            {
                "task_id": result.task_id if task_id is None else task_id,
                "attempt": attempt,
                "rollout_id": result.rollout_id,
                "branch": row.branch,
                "turn_indices": row.turn_indices,
                "prompt_ids": row.token_ids[:p],
                "completion_ids": row.token_ids[p:],
                "loss_mask": row.loss_mask[p:],
                "logprobs": row.logprobs[p:],
                "reward": row.reward,
                "trainable": row.trainable,
                "untrainable_reason": row.untrainable_reason,
                "mask_sample": result.mask_sample,
                "stale": row.stale,
            }
        )
    return out


def _common_prefix(a: list[Any], b: list[Any]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def pack(result: RolloutResult) -> dict[str, Any]:
    """A JSON-ready dict of `result` whose size grows linearly with the conversation."""
    data = result.model_dump(mode="json")
    by_index = {t.index: t for t in result.proxy_turns}
    turns = []
    for t, raw in zip(result.proxy_turns, data["proxy_turns"]):
        parent = by_index.get(t.parent) if t.parent is not None else None
        if parent is not None:
            if t.continues(parent):
                raw["prompt_token_ids"] = t.prompt_token_ids[len(parent.prompt_token_ids) + len(parent.completion_token_ids) :]
                raw["prompt_extends_parent"] = True
            keep = _common_prefix(parent.request_messages, t.request_messages)
            raw["request_messages"] = raw["request_messages"][keep:]
            raw["request_messages_from_parent"] = keep
            if t.request_tools == parent.request_tools:
                raw.pop("request_tools")
                raw["request_tools_from_parent"] = True
        turns.append(raw)
    data["proxy_turns"] = turns
    data["format"] = FORMAT
    return data


def unpack(data: dict[str, Any]) -> RolloutResult:
    """The RolloutResult `pack` stored (a plain RolloutResult dict is read as it is)."""
    if data.get("format") != FORMAT:
        return RolloutResult.model_validate(data)
    data = dict(data)
    data.pop("format")
    rebuilt: dict[int, Turn] = {}
    turns = []
    for raw in sorted(data.get("proxy_turns", []), key=lambda r: r["index"]):
        raw = dict(raw)
        extends = raw.pop("prompt_extends_parent", False)
        from_parent = raw.pop("request_messages_from_parent", 0)
        tools_from_parent = raw.pop("request_tools_from_parent", False)
        parent = rebuilt.get(raw["parent"]) if raw.get("parent") is not None else None
        if parent is not None:
            if extends:
                raw["prompt_token_ids"] = parent.prompt_token_ids + parent.completion_token_ids + raw["prompt_token_ids"]
            raw["request_messages"] = parent.request_messages[:from_parent] + raw["request_messages"]
            if tools_from_parent:
                raw["request_tools"] = parent.request_tools
        turn = Turn.model_validate(raw)
        rebuilt[turn.index] = turn
        turns.append(turn)
    data["proxy_turns"] = turns
    return RolloutResult.model_validate(data)


def save(result: RolloutResult, path: str | Path) -> int:
    """Write `result` compactly to `path`; returns the bytes written."""
    text = json.dumps(pack(result), separators=(",", ":"))
    Path(path).write_text(text)
    return len(text.encode())


def load(path: str | Path) -> RolloutResult:
    return unpack(json.loads(Path(path).read_text()))
