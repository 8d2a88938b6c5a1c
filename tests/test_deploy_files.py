"""The Dockerfile and openenv.yaml cannot be built or deployed here (no Docker engine); these
tests check them against what they must agree with: the pinned versions, the console script, the
server's CLI, and OpenEnv's validator."""

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from harness_env.cli import build_parser
from harness_env.core.toolchain import NODE_VERSION, PINS

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instructions(name: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.startswith(name + " ")]


def test_harnesses_are_installed_from_the_pin_table_only():
    assert any("harness-env install" in run for run in _instructions("RUN"))
    # No version of a harness or of Node is written into the Dockerfile: one table rules.
    for pin in PINS.values():
        assert pin.package not in DOCKERFILE
    assert NODE_VERSION not in DOCKERFILE and "npm install" not in DOCKERFILE


def test_it_runs_the_console_script_the_package_declares():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    [cmd] = _instructions("CMD")
    argv = shlex.split(eval(cmd)[-1])  # CMD ["sh", "-c", "exec harness-env serve ..."]
    assert argv[:3] == ["exec", "harness-env", "serve"] and "harness-env" in scripts
    args = build_parser().parse_args([a.replace("${PORT:-7860}", "7860") for a in argv[2:]])
    assert (args.command, args.host, args.port) == ("serve", "0.0.0.0", 7860)


def test_space_conventions():
    assert _instructions("EXPOSE") == ["7860"]
    assert "PORT=7860" in DOCKERFILE
    [health] = _instructions("HEALTHCHECK")
    assert "/health" in health
    [user] = _instructions("USER")
    assert user not in ("root", "0")
    assert any("--extra server" in run and "--locked" in run for run in _instructions("RUN"))
    assert "bubblewrap" in DOCKERFILE


def test_openenv_validate_passes():
    openenv = Path(sys.executable).parent / "openenv"
    # Runtime checks need a Docker build (no engine here): they are skipped, the verdict is WARN.
    p = subprocess.run([str(openenv), "validate"], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PASS  static.manifest" in p.stdout and "FAIL" not in p.stdout


def test_every_package_of_the_source_tree_goes_into_the_wheel():
    """A package missing from pyproject's list is missing from the wheel: imports fail only in a
    non-editable install (pip install harness-env, a Docker image)."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"harness_env"} | {
        "harness_env." + ".".join(p.parent.relative_to(root).parts)
        for p in root.rglob("__init__.py")
        if p.parent != root and p.parent.relative_to(root).parts[0] not in ("tests", "bench", "examples", ".venv")
    }
    assert found - listed == set(), f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"
