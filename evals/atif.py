"""An ATIF trajectory (Harbor's Agent Trajectory Interchange Format) built from captured turns.

For a rollout whose agent wrote no trajectory of its own: the first policy turn's request gives
the system and user steps, each policy turn one agent step (its text, reasoning and tool calls),
and the tool results the next turn sends back become that step's observation. Each agent step's
metrics hold its completion_token_ids and logprobs, as ATIF names them, and its prompt's length
but not its prompt_token_ids: ATIF means the whole prompt by them, history included, which grows
with the square of the conversation; the export's token sidecar (evals/sidecar.py) holds each
step's new prompt ids instead. The turn graph's place (turn, parent, branch, link, weight version)
is in the step's `extra`. Plain dicts: Harbor is not needed to build or read it.
"""

from __future__ import annotations

import json
from typing import Any

from harness_env.models import RolloutResult, Turn

SCHEMA_VERSION = "ATIF-v1.8"  # the newest Harbor publishes: 0.25 and 0.26 have the same trajectory models


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {"raw": raw}
    return value if isinstance(value, dict) else {"value": value}


def _tool_calls(turn: Turn) -> list[dict[str, Any]]:
    calls = []
    for n, c in enumerate(turn.tool_calls):
        fn = c.get("function") or {}
        calls.append(
            {
                "tool_call_id": str(c.get("id") or f"call_{turn.index}_{n}"),
                "function_name": str(fn.get("name", c.get("name", ""))),
                "arguments": _arguments(fn.get("arguments", c.get("arguments"))),
            }
        )
    return calls


def _observation(calls: list[dict[str, Any]], later: Turn | None) -> dict[str, Any] | None:
    if later is None or not calls:
        return None
    ids = {c["tool_call_id"] for c in calls}
    results = [
        {"source_call_id": m["tool_call_id"], "content": _text(m.get("content"))}
        for m in later.request_messages
        if m.get("role") == "tool" and m.get("tool_call_id") in ids
    ]
    return {"results": results} if results else None


def build_trajectory(result: RolloutResult, model: str = "") -> dict[str, Any]:
    """The ATIF trajectory of `result`'s policy turns (see the module's docstring)."""
    turns = sorted((t for t in result.proxy_turns if t.purpose == "policy"), key=lambda t: t.index)
    steps: list[dict[str, Any]] = []
    for m in turns[0].request_messages if turns else []:
        if m.get("role") in ("system", "user", "developer"):
            steps.append({"step_id": len(steps) + 1, "source": "user" if m["role"] == "user" else "system", "message": _text(m.get("content"))})
    for n, t in enumerate(turns):
        calls = _tool_calls(t)
        step: dict[str, Any] = {
            "step_id": len(steps) + 1,
            "source": "agent",
            "model_name": model or None,
            "message": t.completion_text,
            "reasoning_content": t.reasoning_text or None,
            "tool_calls": calls or None,
            "observation": _observation(calls, turns[n + 1] if n + 1 < len(turns) else None),
            "metrics": {
                "prompt_tokens": len(t.prompt_token_ids) or None,
                "completion_tokens": len(t.completion_token_ids) or None,
                "completion_token_ids": t.completion_token_ids or None,
                "logprobs": t.per_token_logps or None,
            },
            "extra": {
                "turn_index": t.index,
                "parent": t.parent,
                "branch": t.branch,
                "link": t.link,
                "weight_version": t.weight_version,
                "finish_reason": t.finish_reason,
                "capture_level": t.capture_level,
            },
        }
        steps.append({k: v for k, v in step.items() if v is not None})
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": result.rollout_id or None,
        "agent": {"name": result.harness or "unknown", "version": "unknown", "model_name": model or None},
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": sum(len(t.prompt_token_ids) for t in turns),
            "total_completion_tokens": sum(len(t.completion_token_ids) for t in turns),
            "total_steps": len(steps),
        },
        "extra": {"reward": result.reward, "error_kind": result.error_kind, "built_by": "harness-env from the captured turns"},
    }


def turn_steps(trajectory: dict[str, Any]) -> dict[int, int]:
    """Turn index -> step_id of the agent steps of a trajectory `build_trajectory` made."""
    return {s["extra"]["turn_index"]: s["step_id"] for s in trajectory.get("steps", []) if "turn_index" in (s.get("extra") or {})}


def trajectory_of(result: RolloutResult, model: str = "") -> dict[str, Any]:
    """The agent's own ATIF trajectory when it wrote one (Harbor's agents), else one built from the turns."""
    return result.agent_trajectory if result.agent_trajectory else build_trajectory(result, model)
