"""The lint is part of the suite: `ruff check` and `ruff format --check` over the whole tree
(package, tests, bench, examples) with the settings of pyproject.toml's [tool.ruff], so a change
that breaks them fails here, not in a review."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed: uv sync (it is in the dev group)")
    p = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"ruff check found problems (fix them, or `ruff check --fix` for the fixable ones):\n{p.stdout}{p.stderr}"


def test_ruff_format_leaves_the_tree_as_it_is():
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed: uv sync (it is in the dev group)")
    p = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", str(ROOT)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"ruff format would change these files (run `ruff format .`):\n{p.stdout}{p.stderr}"
