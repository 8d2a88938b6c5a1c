"""Wire types, part 4: a rollout's summary, what an agent calling `run_rollout` over MCP gets unless
it asks for the whole result. Import them from `harness_env.models`.

A whole RolloutResult is sized for a trainer: every turn's prompt repeats the conversation so far,
so 40 turns weigh megabytes, enough to flood an agent's context. The summary says what an agent
acts on (reward, what broke, what the agent said and changed, how much it cost) in at most
MAX_SUMMARY_BYTES of JSON whatever the rollout: every text is clipped to a budget counted in bytes
of its widest JSON form, and every list is capped, saying how many entries were left off.
`summarize` is a pure function of the result, so a client holding a whole result can summarize
it the same way.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, Field

from harness_env.models.results import LINK_KINDS, CaptureLevel, ErrorKind, RolloutResult

Detail = Literal["summary", "full"]
MAX_SUMMARY_BYTES = 16 * 1024

# The budget, in bytes of JSON with every non-ASCII character escaped (the widest form: a
# character may take 12 bytes); each cap also bounds the field's length in characters. Texts:
# 1,500 + 3,000 + 6 x 240 + 10 x (32 + 120) + 30 x 100 + ~700 for the short ones = ~11,200;
# keys, numbers and punctuation take the rest (~3,000 at the most).
ERROR_BYTES = 1500
FINAL_TEXT_BYTES = 3000
NOTE_BYTES, MAX_NOTES = 240, 6
PHASE_NAME_BYTES, PHASE_DETAIL_BYTES, MAX_PHASES = 32, 120, 10
PATH_BYTES, MAX_FILES_SHOWN = 100, 30
NAME_BYTES = 64  # rollout id, harness, reward source
TASK_ID_BYTES = 128
REASON_BYTES = 240
TRUNCATED_MARK = "\n[... truncated ...]"  # what the sandbox appends to a file it cut (core/sandbox)


def json_size(text: str) -> int:
    """Bytes `text` takes as a JSON string, quotes left out, every non-ASCII character escaped."""
    return len(json.dumps(text)) - 2


def clip(text: str, limit: int) -> str:
    """`text` whole when its JSON form fits in `limit` bytes, else its longest head that fits with
    a mark saying how much was cut."""
    if len(text) <= limit and json_size(text) <= limit:
        return text
    lo, hi = 0, min(len(text), limit)  # a character takes at least one byte
    while lo < hi:  # the longest head that fits with its mark
        mid = (lo + hi + 1) // 2
        if json_size(text[:mid] + _cut_mark(len(text) - mid)) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo] + _cut_mark(len(text) - lo)


def _cut_mark(left_off: int) -> str:
    return f" [... {left_off} more characters]"


class SummaryPhase(BaseModel):
    name: str = Field(max_length=PHASE_NAME_BYTES)
    duration_s: float
    ok: bool = True
    detail: str = Field("", max_length=PHASE_DETAIL_BYTES)


class SummaryFile(BaseModel):
    """A file of the workspace at the end: its path and size, not its content."""

    path: str = Field(max_length=PATH_BYTES)
    bytes: int  # of the content collected (UTF-8)
    truncated: bool = False  # the sandbox collected only its head


class RolloutSummary(BaseModel):
    """A rollout in at most MAX_SUMMARY_BYTES of JSON (run_rollout's default answer over MCP).
    The whole result (captured turns with token ids and logprobs, file contents, logs) comes
    with detail="full"."""

    detail: Literal["summary"] = "summary"  # tells it from a whole RolloutResult
    rollout_id: str = Field("", max_length=NAME_BYTES)
    task_id: str | None = Field(None, max_length=TASK_ID_BYTES)
    harness: str = Field("", max_length=NAME_BYTES)
    reward: float | None = None
    reward_source: str | None = Field(None, max_length=NAME_BYTES)
    reward_notes: list[str] = Field(default_factory=list, max_length=MAX_NOTES)
    reward_notes_left_off: int = 0
    error_kind: ErrorKind | None = None
    error: str | None = Field(None, max_length=ERROR_BYTES)
    wall_s: float = 0.0
    phases: list[SummaryPhase] = Field(default_factory=list, max_length=MAX_PHASES)
    phases_left_off: int = 0
    agent_final_text: str = Field("", max_length=FINAL_TEXT_BYTES)
    agent_exit_code: int | None = None
    model_calls: int = 0
    prompt_tokens: int = 0  # summed over the model calls (each prompt counts the conversation so far)
    completion_tokens: int = 0
    tool_calls: int | None = None  # as the harness counted them; else the calls the model asked for
    turn_limit_hit: bool = False
    files: list[SummaryFile] = Field(default_factory=list, max_length=MAX_FILES_SHOWN)
    files_left_off: int = 0
    capture_level: CaptureLevel = "none"
    rollout_type: Literal["train", "eval"] = "eval"
    rollout_type_reason: str = Field("", max_length=REASON_BYTES)
    # The turn graph: branches a trainer gets rows for, and turns per link kind (extends,
    # compaction, retry, ...: docs/training.md).
    branches: int = 0
    links: dict[str, int] = Field(default_factory=dict, max_length=len(LINK_KINDS))
    trainable_tokens: int = 0  # of the policy's sampled tokens (graph.sampled_tokens), those a trainer gets
    sampled_tokens: int = 0

    def text(self) -> str:
        """A few lines for a person or an agent: reward, error, counts, the final text's head."""
        reward = "no reward" if self.reward is None else f"reward {self.reward:g}" + (f" ({self.reward_source})" if self.reward_source else "")
        ran = " ".join(p for p in (self.harness, "rollout", self.rollout_id) if p)
        lines = [f"{reward}; {ran} ran {self.wall_s:.1f} s; {self.rollout_type} data ({self.capture_level} captured)"]
        if self.error is not None:
            lines.append(f"error ({self.error_kind}): {clip(self.error, 300)}")
        tools = "" if self.tool_calls is None else f", {_count(self.tool_calls, 'tool call')}"
        lines.append(
            f"{_count(self.model_calls, 'model call')} ({self.prompt_tokens} prompt + {self.completion_tokens} completion tokens)"
            f"{tools}, {_count(len(self.files) + self.files_left_off, 'file')} in the workspace"
        )
        if self.links:
            kinds = ", ".join(f"{n} {kind}" for kind, n in self.links.items())
            trained = f"; {self.trainable_tokens} of {self.sampled_tokens} sampled tokens trainable" if self.sampled_tokens else ""
            lines.append(f"turn graph: {_count(self.branches, 'branch')}; links: {kinds}{trained}")
        if self.agent_final_text:
            lines.append(f"final text: {clip(' '.join(self.agent_final_text.split()), 300)}")
        return "\n".join(lines)


def summarize(result: RolloutResult) -> RolloutSummary:
    """The summary of `result`, at most MAX_SUMMARY_BYTES serialized whatever it holds."""
    turns = result.proxy_turns
    final = result.agent_final_text or next((t.completion_text for t in reversed(turns) if t.purpose == "policy" and t.completion_text), "")
    files = sorted(result.files.items())
    tool_calls = result.agent_tool_calls
    if tool_calls is None and turns:
        tool_calls = sum(len(t.tool_calls) for t in turns)
    return RolloutSummary(
        rollout_id=clip(result.rollout_id, NAME_BYTES),
        task_id=None if result.task_id is None else clip(result.task_id, TASK_ID_BYTES),
        harness=clip(result.harness, NAME_BYTES),
        reward=result.reward,
        reward_source=result.reward_source,
        reward_notes=[clip(n, NOTE_BYTES) for n in result.reward_notes[:MAX_NOTES]],
        reward_notes_left_off=max(0, len(result.reward_notes) - MAX_NOTES),
        error_kind=result.error_kind,
        error=None if result.error is None else clip(result.error, ERROR_BYTES),
        wall_s=result.wall_s,
        phases=[
            SummaryPhase(name=clip(p.name, PHASE_NAME_BYTES), duration_s=p.duration_s, ok=p.ok, detail=clip(p.detail, PHASE_DETAIL_BYTES))
            for p in result.phases[:MAX_PHASES]
        ],
        phases_left_off=max(0, len(result.phases) - MAX_PHASES),
        agent_final_text=clip(final, FINAL_TEXT_BYTES),
        agent_exit_code=result.agent_exit_code,
        model_calls=len(turns),
        # The engine's counts (token ids); a black-box call has only the endpoint's usage.
        prompt_tokens=sum(len(t.prompt_token_ids) or _usage(t.usage, "prompt_tokens") for t in turns),
        completion_tokens=sum(len(t.completion_token_ids) or _usage(t.usage, "completion_tokens") for t in turns),
        tool_calls=tool_calls,
        turn_limit_hit=result.turn_limit_hit,
        files=[
            SummaryFile(path=clip(path, PATH_BYTES), bytes=len(content.encode("utf-8", "replace")), truncated=content.endswith(TRUNCATED_MARK))
            for path, content in files[:MAX_FILES_SHOWN]
        ],
        files_left_off=max(0, len(files) - MAX_FILES_SHOWN),
        capture_level=result.capture_level,
        rollout_type=result.rollout_type,
        rollout_type_reason=clip(result.rollout_type_reason, REASON_BYTES),
        branches=result.graph.branches,
        links={kind: result.graph.links[kind] for kind in LINK_KINDS if result.graph.links.get(kind)},  # the known kinds only
        trainable_tokens=result.graph.trainable_tokens,
        sampled_tokens=result.graph.sampled_tokens,
    )


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "es" if what.endswith("ch") else "s")


def _usage(usage: dict | None, key: str) -> int:
    value = (usage or {}).get(key)  # as the endpoint sent it: anything
    return min(value, 10**12) if isinstance(value, int) and value >= 0 else 0
