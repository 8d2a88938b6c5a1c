"""Example tasks that fill the web form: data only, so adding one needs no UI change. Shell tasks
are listed here; each task family offers its own (`example`, families/base.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness_env import families  # noqa: F401 - registers the task families, whose examples are offered
from harness_env.core.registry import family_names, get_family


@dataclass(frozen=True)
class ExampleTask:
    name: str
    instruction: str
    setup: list[str] = field(default_factory=list)
    verify: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    task_family: str | None = None  # None: a shell task graded by its verify commands
    family_options: dict[str, Any] = field(default_factory=dict)


_CALC = """def add(a, b):
    return a - b


def mul(a, b):
    return a * b
"""

_TEST_CALC = """import unittest

from calc import add, mul


class CalcTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_mul(self):
        self.assertEqual(mul(2, 3), 6)


if __name__ == "__main__":
    unittest.main()
"""

EXAMPLES: list[ExampleTask] = [
    ExampleTask(
        name="write a file",
        instruction="Create a file hello.txt in the current directory containing exactly the word hello.",
        setup=["git init -q ."],
        verify=["test -f hello.txt", "grep -qx hello hello.txt"],
        files={"README.md": "A scratch repository for the write-a-file example.\n"},
    ),
    ExampleTask(
        name="fix a failing Python test",
        instruction="The unit tests in test_calc.py fail. Fix the bug in calc.py (do not change the tests), "
        "then run `python3 -m unittest -q test_calc` to check.",
        verify=["python3 -m unittest -q test_calc"],
        files={"calc.py": _CALC, "test_calc.py": _TEST_CALC},
    ),
    ExampleTask(
        name="a task that fails on purpose",
        instruction="Write the secret number into answer.txt. (Nobody told you the number: this task is meant to fail, "
        "to show what a failed verify looks like.)",
        verify=["test -f answer.txt", 'test "$(cat answer.txt)" = "8675309-not-guessable"'],
    ),
]


def examples() -> list[ExampleTask]:
    """The shell examples, then one of each registered family that offers one."""
    registered = (get_family(name) for name in family_names())
    return [
        *EXAMPLES,
        *(
            ExampleTask(f.example.name, f.example.instruction, task_family=f.name, family_options=dict(f.example.family_options))
            for f in registered
            if f.example is not None
        ),
    ]


def example_names() -> list[str]:
    return [e.name for e in examples()]


def get_example(name: str) -> ExampleTask:
    for e in examples():
        if e.name == name:
            return e
    raise KeyError(f"no example task named {name!r}")
