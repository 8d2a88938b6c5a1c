"""The task families of examples/train_cpu.py, their splits, and the success rate over them.

Each family asks for a file NAME.txt holding WORD (verify: it exists; it holds exactly WORD):
`write_call` and `bash_call` spell out the tool call to make, `plain_file` does not; the held-out
split uses names and words no training task has. `FIRST_CALL_REGEX` is the first answer's shape
under `--constrain-first-call`.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness_env.client.trl import RunMany

TRAIN_NAMES = ["notes", "hello", "todo", "data", "log", "result", "out", "greeting"]
TRAIN_WORDS = ["apple", "river", "green", "seven", "cloud", "tiger", "piano", "lemon"]
HELDOUT_NAMES = ["report", "list", "memo", "draft"]
HELDOUT_WORDS = ["orange", "stone", "violet", "eagle"]


def _verify(name: str, word: str) -> list[str]:
    """Two checks (reward 0, 0.5 or 1): the file exists; it holds exactly the word."""
    return [f"test -f {name}.txt", f'test "$(cat {name}.txt)" = {word}']


def write_call(name: str, word: str) -> dict[str, Any]:
    call = f'{{"name": "write", "arguments": {{"path": "{name}.txt", "content": "{word}"}}}}'
    return {"instruction": f"Answer with exactly this tool call:\n<tool_call>\n{call}\n</tool_call>", "verify": _verify(name, word)}


def bash_call(name: str, word: str) -> dict[str, Any]:
    call = f'{{"name": "bash", "arguments": {{"command": "echo {word} > {name}.txt"}}}}'
    return {"instruction": f"Answer with exactly this tool call:\n<tool_call>\n{call}\n</tool_call>", "verify": _verify(name, word)}


def plain_file(name: str, word: str) -> dict[str, Any]:
    return {"instruction": f"Create a file named {name}.txt containing the word {word}.", "verify": _verify(name, word)}


# name -> (task maker, what it asks)
FAMILIES: dict[str, tuple[Callable[[str, str], dict[str, Any]], str]] = {
    "write_call": (write_call, "give the write tool call the instruction spells out"),
    "bash_call": (bash_call, "give the bash tool call (echo WORD > NAME.txt) the instruction spells out"),
    "plain_file": (plain_file, "create NAME.txt containing WORD (no hint of the tool-call format)"),
}


def make_tasks(family: str, split: str) -> list[dict[str, Any]]:
    """The family's tasks of a split: `train` (8 names x 8 words) or `heldout` (4 x 4, names and
    words no training task has)."""
    maker = FAMILIES[family][0]
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be train or heldout, not {split!r}")
    names, words = (TRAIN_NAMES, TRAIN_WORDS) if split == "train" else (HELDOUT_NAMES, HELDOUT_WORDS)
    return [{**maker(n, w), "task_id": f"{family}/{split}/{n}-{w}"} for n in names for w in words]


def _regex_literal(text: str) -> str:
    """`text` as a regular expression matching itself, in the engine's dialect (only its metacharacters escaped)."""
    return re.sub(r"([{}\[\]().|*+?^$\\])", r"\\\1", text)


def _one_of(options: Sequence[str]) -> str:
    return "(" + "|".join(_regex_literal(o) for o in sorted(options)) + ")"


# The first answer's shape under --constrain-first-call: the shell tool (`bash`, as the white-box
# loop and Pi name it) writing one of the tasks' words (training and held-out alike) to one of their
# file names, in the Hermes format the engine's tool parser reads. Which word and which file is the
# model's choice: the task is to pick the pair the instruction asks for (1 in 144 by chance).
FIRST_CALL_REGEX = (
    _regex_literal('<tool_call>\n{"name": "bash", "arguments": {"command": "echo ')
    + _one_of(TRAIN_WORDS + HELDOUT_WORDS)
    + _regex_literal(" > ")
    + _one_of(TRAIN_NAMES + HELDOUT_NAMES)
    + _regex_literal('.txt"}}\n</tool_call>')
)


@dataclass
class Evaluation:
    """Success (reward 1: both checks passed) over `n` attempts, with its standard error."""

    version: int
    n: int
    successes: int
    mean_reward: float
    failed: int  # attempts without a reward (infrastructure)
    seconds: float

    @property
    def rate(self) -> float:
        return self.successes / self.n if self.n else 0.0

    @property
    def stderr(self) -> float:
        return math.sqrt(self.rate * (1 - self.rate) / self.n) if self.n else 0.0

    def line(self) -> str:
        return f"{self.rate:.3f} ± {self.stderr:.3f} (n={self.n}, {self.successes} successes, weights v{self.version})"


def evaluate(tasks: list[dict[str, Any]], attempts: int, request: dict[str, Any], run_many: RunMany, version: int) -> Evaluation:
    """Every task `attempts` times at the training temperature against the served weights."""
    started = time.monotonic()
    results = run_many([{**request, "task": t} for t in tasks for _ in range(attempts)])
    rewards = [r.reward for r in results]  # None: an infrastructure failure (an end the agent caused is graded)
    scored = [r for r in rewards if r is not None]
    return Evaluation(
        version=version,
        n=len(scored),
        successes=sum(r >= 1.0 for r in scored),
        mean_reward=statistics.fmean(scored) if scored else 0.0,
        failed=len(rewards) - len(scored),
        seconds=time.monotonic() - started,
    )
