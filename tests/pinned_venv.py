"""A venv of its own under the tools directory (core/toolchain.tools_dir) holding one pinned package
and what it brings: for tools the project's lock cannot hold (vLLM's CPU build: tests/vllm_engine.py;
OpenEnv 0.10: tests/openenv_env.py). Made once; a marker file says it is whole, so an install that
was killed half-way is made again rather than used."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness_env.core.toolchain import tools_dir


@dataclass(frozen=True)
class PinnedVenv:
    pin: str  # "package==version"
    name: str  # the tool's name: the venv is <tools dir>/<name>-<version>
    base_python: Callable[[], str]  # the interpreter the venv is made from

    @property
    def dir(self) -> Path:
        return tools_dir() / f"{self.name}-{self.pin.split('==')[1]}"

    @property
    def python(self) -> Path:
        return self.dir / "bin" / "python"

    def installed(self) -> bool:
        return (self.dir / ".installed").exists() and self.python.exists()

    def install(self, finish: Callable[[str], None], log=print) -> Path:
        """Make the venv unless it is whole: pip installs the pin, then `finish(python)` does what
        else the tool needs (checks, removals) before the venv is marked whole."""
        if self.installed():
            return self.python
        if self.dir.exists():
            shutil.rmtree(self.dir)  # a half-made one, from an install that was killed
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        log(f"{self.name}: installing {self.pin} into {self.dir}")
        subprocess.run([self.base_python(), "-m", "venv", str(self.dir)], check=True, cwd="/")
        py = str(self.python)
        subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--progress-bar", "off", self.pin], check=True, cwd="/")
        finish(py)
        (self.dir / ".installed").write_text(self.pin + "\n")
        log(f"{self.name}: installed in {time.monotonic() - started:.0f}s")
        return self.python
