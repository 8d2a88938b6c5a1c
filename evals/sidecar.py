"""The export's token sidecar, and the training rows rebuilt from it.

Each attempt of the export's `results` table has its ATIF `trajectory` and, beside it, a `tokens`
column: the sidecar, one record per captured turn that is an agent step or in a training row, in
turn order (a JSON string, like the trajectory):

  step_id         the trajectory's agent step showing this turn (None when the trajectory is the
                  one a Harbor agent wrote: its steps are not our turns)
  turn_index, branch, parent, link   the turn graph (core/capture/graph.py); branch None: in no row
  prompt_offset   how many prompt tokens come before `prompt_ids`: the branch's tokens so far (its
                  previous turn's prompt + completion) when the turn continues them, else 0
  prompt_ids      the prompt tokens the turn adds: prompt_token_ids[prompt_offset:] (the whole
                  prompt on a branch's first turn)
  completion_ids, logprobs           what the engine sampled, and its logprob of each
  loss_mask       aligned with prompt_ids + completion_ids: 0 on the prompt's, 1 on sampled tokens
                  (0 on a masked turn's too: a constrained turn of a rollout with mask_constrained)
  weight_version, stale, constrained, masked, capture_level   as on the turn (models/results.py)

Why a column, not the trajectory's own fields: ATIF's `metrics.prompt_token_ids` is the whole
prompt, history included (Harbor's Metrics and RolloutDetail say so), which grows with the square
of the conversation; the new ids are not what that field means. And a Harbor rollout exports the
trajectory its agent wrote, which we do not rewrite, while its rows come from our captured turns.
So the trajectory stays what ATIF says (valid against Harbor's models, completion ids and
logprobs in each agent step's metrics, no prompt ids) and the sidecar holds what a trainer needs,
readable as plain JSON without Harbor. `rows_from_export` rebuilds exactly the rows
`storage.row_records` writes to the `rows` table (a trainer without this package concatenates a
branch's records: the first record's prompt, then each completion and the next new prompt ids).
"""

from __future__ import annotations

import json
from typing import Any

from harness_env.models import RolloutResult, Turn
from harness_env.storage import row_records


def token_sidecar(result: RolloutResult, steps: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """The sidecar of `result` (see the module's docstring); `steps`: turn index -> step_id."""
    last: dict[int, Turn] = {}  # per branch: its latest turn so far
    out = []
    for t in sorted(result.proxy_turns, key=lambda t: t.index):
        if t.purpose != "policy" and t.branch is None:  # auxiliary: never a step, never a row
            continue
        previous = last.get(t.branch) if t.branch is not None else None
        offset = len(previous.prompt_token_ids) + len(previous.completion_token_ids) if previous and t.continues(previous) else 0
        if t.branch is not None:
            last[t.branch] = t
        new = t.prompt_token_ids[offset:]
        out.append(
            {
                "step_id": (steps or {}).get(t.index),
                "turn_index": t.index,
                "branch": t.branch,
                "parent": t.parent,
                "link": t.link,
                "prompt_offset": offset,
                "prompt_ids": new,
                "completion_ids": t.completion_token_ids,
                "logprobs": t.per_token_logps,
                "loss_mask": [0] * len(new) + t.completion_mask(),
                "weight_version": t.weight_version,
                "stale": t.stale,
                "constrained": t.constrained,
                "masked": t.masked,
                "capture_level": t.capture_level,
            }
        )
    return out


def prompts(sidecar: list[dict[str, Any]]) -> dict[int, list[int]]:
    """Each record's whole prompt (turn index -> ids), as the engine saw it: the branch's previous
    record's prompt + completion up to `prompt_offset`, then `prompt_ids`. For a trainer that wants
    ATIF's `prompt_token_ids` (the whole prompt) back, or trains per call."""
    so_far: dict[int, list[int]] = {}  # per branch: its previous record's prompt + completion
    out = {}
    for rec in sorted(sidecar, key=lambda r: r["turn_index"]):
        whole = so_far.get(rec["branch"], [])[: rec["prompt_offset"]] + rec["prompt_ids"]
        if rec["branch"] is not None:
            so_far[rec["branch"]] = whole + rec["completion_ids"]
        out[rec["turn_index"]] = whole
    return out


def rows_from_sidecar(
    sidecar: list[dict[str, Any]], *, task_id: str | None, attempt: int, rollout_id: str, reward: float | None, mask_sample: bool
) -> list[dict[str, Any]]:
    """The training rows (storage.ROW_COLUMNS, one per branch, by branch) a sidecar holds: its turns
    rebuilt with their whole prompts, then the same row builder the `rows` table comes from."""
    whole = prompts(sidecar)
    turns = [
        Turn(
            index=r["turn_index"],
            branch=r["branch"],
            parent=r["parent"],
            link=r["link"],
            prompt_token_ids=whole[r["turn_index"]],
            completion_token_ids=r["completion_ids"],
            per_token_logps=r["logprobs"],
            capture_level=r["capture_level"],
            weight_version=r["weight_version"],
            stale=r["stale"],
            constrained=r["constrained"],
            masked=r.get("masked", False),  # an export from before mask_constrained: none masked
        )
        for r in sidecar
    ]
    result = RolloutResult(rollout_id=rollout_id, task_id=task_id, reward=reward, proxy_turns=turns)
    return [{**row, "mask_sample": mask_sample} for row in row_records(result, task_id=task_id, attempt=attempt)]


def rows_from_export(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The training rows of one row of the export's `results` table, as read back (JSON lines or
    parquet): its sidecar (`tokens`) with the attempt's reward and identity."""
    tokens = record["tokens"]
    sidecar = json.loads(tokens) if isinstance(tokens, str) else tokens
    return rows_from_sidecar(
        sidecar,
        task_id=record["task_id"],
        attempt=record["attempt"],
        rollout_id=record["rollout_id"],
        reward=record["reward"],
        mask_sample=record["mask_sample"],
    )
