"""The scripted policy of tests/fakes, served from a process of its own (so its CPU is not the
benchmark's), for the benchmarks that run real harnesses."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_SERVE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from tests.fakes.policy import FakePolicy, FakePolicyServer
srv = FakePolicyServer(FakePolicy(scripts={"m": json.loads(sys.argv[2])}, delay_s=float(sys.argv[3]))).__enter__()
print(srv.base_url, flush=True)
time.sleep(1e9)
"""


@contextmanager
def scripted_policy(script: list[dict], delay_s: float = 0.0) -> Iterator[str]:
    """Yields the base URL of a policy that answers model "m" with `script`, each answer
    `delay_s` seconds after its request arrived."""
    proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(ROOT), json.dumps(script), str(delay_s)], stdout=subprocess.PIPE, text=True)
    try:
        yield proc.stdout.readline().strip()  # type: ignore[union-attr]
    finally:
        proc.kill()
        proc.wait()
