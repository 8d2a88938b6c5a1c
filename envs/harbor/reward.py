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
- neither file: None, with a note (the verifier never ran, or wrote no reward).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from harness_env.core.errors import InvalidRequestError
from harness_env.core.reward import parse_reward_text

REWARD_JSON = "reward.json"
REWARD_TXT = "reward.txt"
MAX_REWARD_FILE_BYTES = 1024 * 1024
DEFAULT_KEY = "reward"

RewardSource = Literal["reward_json", "reward_txt"]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite_number(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value)


def _describe(value: Any) -> str:
    return repr(value)[:80]


def _read_bounded(path: Path) -> str:
    with path.open("rb") as f:
        data = f.read(MAX_REWARD_FILE_BYTES + 1)
    if len(data) > MAX_REWARD_FILE_BYTES:
        raise ValueError(f"larger than {MAX_REWARD_FILE_BYTES} bytes")
    return data.decode("utf-8", errors="replace")


def _pick_from_map(rewards: dict[str, Any], reward_key: str | None, notes: list[str]) -> float | None:
    keys = sorted(rewards)
    if reward_key is not None:
        if reward_key not in rewards:
            raise InvalidRequestError(
                f"reward_key {reward_key!r} is not in the verifier's reward.json; its keys are {keys}"
            )
        key = reward_key
    elif len(rewards) == 1:
        key = keys[0]
    elif DEFAULT_KEY in rewards:
        key = DEFAULT_KEY
    else:
        notes.append(
            f"reward.json holds several rewards {keys} and none is named {DEFAULT_KEY!r}: "
            "set reward_key to pick one"
        )
        return None
    for other in keys:
        if other != key and not _is_finite_number(rewards[other]):
            notes.append(f"reward.json key {other!r} holds a non-finite or non-numeric value ({_describe(rewards[other])}); ignored")
    value = rewards[key]
    if not _is_number(value):
        notes.append(f"reward.json key {key!r} holds no number ({_describe(value)}): no reward from reward.json")
        return None
    if not math.isfinite(value):
        notes.append(f"reward.json key {key!r} holds a non-finite number ({value}): no reward from reward.json")
        return None
    return float(value)


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
        if not math.isfinite(data):
            notes.append(f"reward.json holds a non-finite number ({data}); ignored")
            return None
        if reward_key is not None and reward_key != DEFAULT_KEY:
            notes.append(f"reward.json holds a single number, not a map: reward_key {reward_key!r} does not apply")
        return float(data)
    notes.append(f"reward.json holds neither a number nor a map of numbers ({_describe(data)}); ignored")
    return None


def reward_map(verifier_dir: Path | None) -> dict[str, float] | None:
    """reward.json's whole map (its finite numbers only), when it holds one; read with the same
    size bound as the reward itself."""
    if verifier_dir is None or not (Path(verifier_dir) / REWARD_JSON).is_file():
        return None
    try:
        data = json.loads(_read_bounded(Path(verifier_dir) / REWARD_JSON))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return {k: float(v) for k, v in data.items() if _is_finite_number(v)}


def read_verifier_reward(
    verifier_dir: Path, reward_key: str | None = None
) -> tuple[float | None, RewardSource | None, list[str]]:
    """(reward, source, notes) from a Harbor verifier directory (the trial's verifier/ dir, which is
    /logs/verifier inside the environment). Raises InvalidRequestError only for an explicit
    `reward_key` that reward.json does not hold."""
    notes: list[str] = []
    json_path, txt_path = Path(verifier_dir) / REWARD_JSON, Path(verifier_dir) / REWARD_TXT
    if json_path.is_file():
        try:
            text = _read_bounded(json_path)
        except (OSError, ValueError) as e:
            notes.append(f"reward.json unreadable ({e}); ignored")
        else:
            value = _reward_from_json(text, reward_key, notes)
            if value is not None:
                return value, "reward_json", notes
    if txt_path.is_file():
        try:
            text = _read_bounded(txt_path)
        except (OSError, ValueError) as e:
            notes.append(f"reward.txt unreadable ({e}); ignored")
            return None, None, notes
        value, note = parse_reward_text(text)
        if value is not None:
            if reward_key is not None and reward_key != DEFAULT_KEY and not json_path.is_file():
                notes.append(f"reward.txt holds a single number: reward_key {reward_key!r} does not apply")
            return value, "reward_txt", notes
        notes.append((note or "reward file unreadable").replace("reward file", "reward.txt"))
        return None, None, notes
    if not json_path.is_file():
        notes.append(
            f"no {REWARD_JSON} or {REWARD_TXT} in the verifier directory: the verifier never ran or wrote no reward"
        )
    return None, None, notes
