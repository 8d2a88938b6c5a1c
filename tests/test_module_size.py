"""No module outgrows what one person can hold in their head: at most 450 lines each.

STYLE.md: few modules pass 450 lines, and files that grow past what one person can hold are what
to avoid. Every Python module of the checkout counts (`git ls-files`: tracked, and new ones not
yet added unless ignored): the package, bench/, examples/, deploy/. The tests themselves do not,
except tests/cpu_policy/, which is no test but an engine the tests and examples/train_cpu.py run
(the CPU stand-in for vLLM), and obeys the same limit.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 450
HELD_TO_IT = ("tests/cpu_policy/",)  # under tests/, but modules, not tests


def modules() -> list[str]:
    """The checkout's Python modules held to the limit, as paths from the root."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    paths = sorted({p for p in listed.split("\0") if p and (ROOT / p).is_file()})  # a path deleted but not yet staged is gone
    return [p for p in paths if not p.startswith("tests/") or p.startswith(HELD_TO_IT)]


def test_every_module_is_at_most_450_lines() -> None:
    sizes = {path: len((ROOT / path).read_text().splitlines()) for path in modules()}
    over = sorted(((n, path) for path, n in sizes.items() if n > MAX_LINES), reverse=True)
    assert not over, (
        f"{len(over)} module(s) over {MAX_LINES} lines; split each by what it holds (one module per concern, "
        "named for it, its importers updated), not by line count:\n" + "\n".join(f"  {path}: {n} lines" for n, path in over)
    )


def test_the_limit_covers_the_stand_in_engine_and_not_the_tests() -> None:
    found = modules()
    assert "cli.py" in found and "examples/train_cpu.py" in found and "tests/cpu_policy/chat_model.py" in found
    assert not [p for p in found if p.startswith("tests/") and not p.startswith(HELD_TO_IT)]
