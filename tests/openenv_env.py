"""OpenEnv 0.10.0 in a venv of its own: the client and validator the suite checks the server against.

OpenEnv 0.10.0 needs fastmcp < 4, while Harbor 0.26 (the `harbor` extra) needs fastmcp >= 4.1.6, so
the two cannot share the project's lock. OpenEnv lives in a venv under the tools directory
(core/toolchain.tools_dir) with nothing of ours in it, the way a user's own OpenEnv install would
be: the tests run its code there as a subprocess, against a real `harness-env serve`. Each check is
a small script in tests/openenv_checks/ that reads its input as JSON on stdin and prints its answer
as JSON on stdout; `openenv validate` is OpenEnv's own console script.

    python -m tests.openenv_env install    # what ./dev test runs: the venv, once
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.pinned_venv import PinnedVenv

OPENENV_PIN = "openenv==0.10.0"
INSTALL_HINT = "./dev test (or: .venv/bin/python -m tests.openenv_env install)"
CHECKS = Path(__file__).resolve().parent / "openenv_checks"


def _base_python() -> str:
    # The interpreter the project's venv was made from (Python >= 3.12, as the project needs).
    return getattr(sys, "_base_executable", sys.executable)


VENV = PinnedVenv(OPENENV_PIN, "openenv", _base_python)


def installed() -> bool:
    return VENV.installed()


def install(log=print) -> Path:
    """The OpenEnv venv, made once (about a minute: OpenEnv brings gradio and huggingface_hub)."""

    def finish(py: str) -> None:
        subprocess.run([py, "-c", "import openenv.core.mcp_client, openenv.core.harness, openenv.cli.__main__"], check=True, cwd="/")

    return VENV.install(finish, log)


def python() -> Path:
    """OpenEnv's python (for an example that imports OpenEnv, as a user would run it)."""
    return _require()


def _require() -> Path:
    """OpenEnv's python; a missing venv is an error that says how to make it, never a skip."""
    if not installed():
        raise RuntimeError(f"no OpenEnv installed at {VENV.dir}: run {INSTALL_HINT}")
    return VENV.python


def _env() -> dict[str, str]:
    # Nothing of the project's venv leaks in (PYTHONPATH, VIRTUAL_ENV), so OpenEnv runs on its own packages.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}


def cli(*args: str, timeout: float = 600, cwd: Path | str = "/") -> subprocess.CompletedProcess[str]:
    """`openenv ARGS` (OpenEnv's console script): its exit code and output."""
    openenv = _require().parent / "openenv"
    return subprocess.run([str(openenv), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=_env())


def check(name: str, payload: Any, timeout: float = 600) -> Any:
    """Run tests/openenv_checks/<name>.py in OpenEnv's venv with `payload` as JSON on stdin: its JSON answer."""
    script = CHECKS / f"{name}.py"
    proc = subprocess.run([str(_require()), str(script)], input=json.dumps(payload), capture_output=True, text=True, timeout=timeout, cwd="/", env=_env())
    if proc.returncode != 0:
        raise RuntimeError(f"OpenEnv check {name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def site_packages() -> Path:
    """OpenEnv's venv's packages directory."""
    [found] = (VENV.dir / "lib").glob("python3*/site-packages")
    return found


def check_beside_trl(name: str, payload: Any, timeout: float = 600) -> Any:
    """Run tests/openenv_checks/<name>.py with the project's python (TRL, from the `train` extra) and
    OpenEnv importable after the project's own packages, as on a trainer host whose TRL harness worker
    imports `openenv.core.harness`: stdin and stdout as check()."""
    _require()
    boot = "import runpy, sys; sys.path.append(sys.argv[1]); sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    script = CHECKS / f"{name}.py"
    proc = subprocess.run(
        [sys.executable, "-c", boot, str(site_packages()), str(script)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
        env=_env(),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"check {name} beside TRL failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if argv[:1] == ["install"]:
        install()
        return 0
    print("usage: python -m tests.openenv_env install", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
