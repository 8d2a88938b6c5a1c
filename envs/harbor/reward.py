"""The reward of a Harbor verifier run, read from the files its tests/test.sh wrote.

Harbor's verifier (harbor/verifier/verifier.py, Verifier.verify) reads
/logs/verifier/reward.json before /logs/verifier/reward.txt; reward.json may hold one number or a
flat map of named numbers (e.g. {"reward": 1, "tests_passed": 3}). We follow the same precedence,
with our own stricter rules:

- finite numbers only: NaN, inf, booleans and strings are ignored and the reason is noted;
- a reward.json that yields no usable value is noted and reward.txt, when present, is read instead
  (like core/reward.py, where a junk reward file falls back to the next source);
- from a map, `reward_key` picks the scalar: an explicit key that is missing is the caller's error
  (InvalidRequestError listing the keys); without one, the map's single key, else "reward", else
  no reward and a note listing the keys;
- neither file: None, with a note (the verifier never ran, or wrote no reward);
- each file is read without following a link, opened non-blocking and only when it is a regular
  file, within MAX_REWARD_FILE_BYTES: a link, FIFO or directory in its place is noted and ignored.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from harness_env.core.errors import InvalidRequestError
from harness_env.core.reward import OUT_OF_RANGE, out_of_range, parse_reward_text
from harness_env.core.sandbox import safefs

REWARD_JSON = "reward.json"
REWARD_TXT = "reward.txt"
MAX_REWARD_FILE_BYTES = 1024 * 1024
DEFAULT_KEY = "reward"

RewardSource = Literal["reward_json", "reward_txt"]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value: int | float) -> bool:
    return isinstance(value, int) or math.isfinite(value)  # isfinite overflows on a huge int


def _is_finite_number(value: Any) -> bool:
    """A number a reward may be: finite and within the reward range (core/reward.py)."""
    return _is_number(value) and _is_finite(value) and not out_of_range(value)


def _describe(value: Any) -> str:
    return repr(value)[:80]


def _read_reward_file(verifier_dir: Path, name: str) -> tuple[str | None, str | None]:
    """(text, note) of `name` in the verifier directory: read without following a link, opened
    non-blocking and only when it is a regular file, at most MAX_REWARD_FILE_BYTES (blocking: call
    it off the event loop). (None, None) when it is not there; (None, why) when it is there but
    is not a regular file or is too large."""
    data = safefs.read_regular(verifier_dir, name, MAX_REWARD_FILE_BYTES + 1)
    if data is None:
        try:
            st = safefs.stat_entry(verifier_dir, name)
        except OSError:  # missing (or the directory is): the verifier never wrote it
            return None, None
        return None, f"{name} is {safefs.kind_of(st.st_mode)}, not a regular file; ignored"
    if len(data) > MAX_REWARD_FILE_BYTES:
        return None, f"{name} unreadable (larger than {MAX_REWARD_FILE_BYTES} bytes); ignored"
    return data.decode("utf-8", errors="replace"), None


def _pick_from_map(rewards: dict[str, Any], reward_key: str | None, notes: list[str]) -> float | None:
    keys = sorted(rewards)
    if reward_key is not None:
        if reward_key not in rewards:
            raise InvalidRequestError(f"reward_key {reward_key!r} is not in the verifier's reward.json; its keys are {keys}")
        key = reward_key
    elif len(rewards) == 1:
        key = keys[0]
    elif DEFAULT_KEY in rewards:
        key = DEFAULT_KEY
    else:
        notes.append(f"reward.json holds several rewards {keys} and none is named {DEFAULT_KEY!r}: set reward_key to pick one")
        return None
    for other in keys:
        if other != key and not _is_finite_number(rewards[other]):
            notes.append(f"reward.json key {other!r} holds a non-finite, out-of-range or non-numeric value ({_describe(rewards[other])}); ignored")
    value = rewards[key]
    if not _is_number(value):
        notes.append(f"reward.json key {key!r} holds no number ({_describe(value)}): no reward from reward.json")
        return None
    if not _usable(value, f"reward.json key {key!r}", ": no reward from reward.json", notes):
        return None
    return float(value)


def _usable(value: int | float, holder: str, outcome: str, notes: list[str]) -> bool:
    """Whether a number read as the reward is finite and in range; if not, why, in `notes`."""
    if not _is_finite(value):
        notes.append(f"{holder} holds a non-finite number ({value}){outcome}")
        return False
    if out_of_range(value):
        notes.append(f"{holder} holds {_describe(value)}, {OUT_OF_RANGE}{outcome}")
        return False
    return True


def _reward_from_json(text: str, reward_key: str | None, notes: list[str]) -> float | None:
    if not text.strip():
        notes.append("reward.json is empty")
        return None
    try:
        data = json.loads(text)
    except ValueError as e:  # JSONDecodeError, and int-conversion limits
        notes.append(f"reward.json is not valid JSON ({e}); ignored")
        return None
    if isinstance(data, dict):
        if not data:
            notes.append("reward.json is an empty map; ignored")
            return None
        return _pick_from_map(data, reward_key, notes)
    if _is_number(data):
        if not _usable(data, "reward.json", "; ignored", notes):
            return None
        if reward_key is not None and reward_key != DEFAULT_KEY:
            notes.append(f"reward.json holds a single number, not a map: reward_key {reward_key!r} does not apply")
        return float(data)
    notes.append(f"reward.json holds neither a number nor a map of numbers ({_describe(data)}); ignored")
    return None


def reward_map(verifier_dir: Path | None) -> dict[str, float] | None:
    """reward.json's whole map (its finite numbers only), when it holds one; read like the reward
    itself (no link followed, bounded)."""
    if verifier_dir is None:
        return None
    text, _ = _read_reward_file(Path(verifier_dir), REWARD_JSON)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return {k: float(v) for k, v in data.items() if _is_finite_number(v)}


def read_verifier_reward(verifier_dir: Path, reward_key: str | None = None) -> tuple[float | None, RewardSource | None, list[str]]:
    """(reward, source, notes) from a Harbor verifier directory (the trial's verifier/ dir, which is
    /logs/verifier inside the environment). Raises InvalidRequestError only for an explicit
    `reward_key` that reward.json does not hold. Blocking reads: call it off the event loop."""
    notes: list[str] = []
    verifier_dir = Path(verifier_dir)
    json_text, json_note = _read_reward_file(verifier_dir, REWARD_JSON)
    json_there = json_text is not None or json_note is not None
    if json_note:
        notes.append(json_note)
    if json_text is not None:
        value = _reward_from_json(json_text, reward_key, notes)
        if value is not None:
            return value, "reward_json", notes
    txt_text, txt_note = _read_reward_file(verifier_dir, REWARD_TXT)
    if txt_note:
        notes.append(txt_note)
        return None, None, notes
    if txt_text is not None:
        value, note = parse_reward_text(txt_text)
        if value is not None:
            if reward_key is not None and reward_key != DEFAULT_KEY and not json_there:
                notes.append(f"reward.txt holds a single number: reward_key {reward_key!r} does not apply")
            return value, "reward_txt", notes
        notes.append((note or "reward file unreadable").replace("reward file", "reward.txt"))
        return None, None, notes
    if not json_there:
        notes.append(f"no {REWARD_JSON} or {REWARD_TXT} in the verifier directory: the verifier never ran or wrote no reward")
    return None, None, notes
