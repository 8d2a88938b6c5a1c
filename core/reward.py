"""Reward rules.

A verify command may write one finite float to the reward file; that value is the reward. NaN,
inf, junk and numbers outside [-MAX_ABS_REWARD, MAX_ABS_REWARD] are ignored (and recorded): a
reward of 1e308 would overflow a trainer's advantage sums and every mean an eval reports. Otherwise the reward is passed/total verify commands;
with no verify commands there is no reward (None). Infrastructure failures never reach here: the
engine leaves their reward None.
"""

from __future__ import annotations

import math

from harness_env.models import CommandResult

MAX_ABS_REWARD = 1e6  # far above any real task's scale (0..1, or a few points), far below float overflow


def parse_reward_text(text: str) -> tuple[float | None, str | None]:
    """(value, note): the value when `text` holds exactly one finite number."""
    stripped = text.strip()
    if not stripped:
        return None, "reward file is empty"
    try:
        value = float(stripped)
    except ValueError:
        return None, f"reward file holds no number: {stripped[:80]!r}"
    if not math.isfinite(value):
        return None, f"reward file holds a non-finite number ({stripped[:20]}); ignored"
    if out_of_range(value):
        return None, f"reward file holds {stripped[:20]}, {OUT_OF_RANGE}; ignored"
    return value, None


OUT_OF_RANGE = f"outside the reward range [-{MAX_ABS_REWARD:.0f}, {MAX_ABS_REWARD:.0f}]"


def out_of_range(value: float) -> bool:
    """A finite number a task may not give as its reward (every reader of reward files asks this)."""
    return abs(value) > MAX_ABS_REWARD


def compute_reward(verify_results: list[CommandResult], reward_file_text: str | None) -> tuple[float | None, str | None, list[str]]:
    """(reward, source, notes) where source is "reward_file", "verify_ratio" or None."""
    notes: list[str] = []
    if reward_file_text is not None:
        value, note = parse_reward_text(reward_file_text)
        if value is not None:
            return value, "reward_file", notes
        notes.append(note or "reward file unreadable")
    if not verify_results:
        notes.append("no verify commands: no reward")
        return None, None, notes
    passed = sum(1 for r in verify_results if r.exit_code == 0)
    return passed / len(verify_results), "verify_ratio", notes


EFFICIENCY_WEIGHT = 0.1
EFFICIENCY_SCALE = 15


def tool_efficiency_reward(correctness: float, tool_calls: int | None) -> tuple[float, str | None]:
    """correctness * (1 + 0.1 * 15 / (15 + tool_calls)) when tool_calls > 0, else correctness.

    The count must be the harness's own verified one; when there is none the bonus is 0 and the
    returned note says so."""
    if tool_calls is None:
        return correctness, "tool-call count not verified for this harness: no efficiency bonus"
    if tool_calls <= 0:
        return correctness, None
    return correctness * (1 + EFFICIENCY_WEIGHT * EFFICIENCY_SCALE / (EFFICIENCY_SCALE + tool_calls)), None
