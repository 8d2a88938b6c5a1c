"""The wheel as a user installs it: built with `uv build`, installed NON-editable with the `server`
extra into a fresh virtual environment, and run from a directory outside the checkout (the rest of
the suite runs the editable install, which finds every module in the source tree whether the wheel
ships it or not).

The install takes the exact versions of uv.lock (`uv export`), so it resolves nothing new and, after
`./dev test`'s `uv sync`, comes from uv's cache."""

from __future__ import annotations

import ast
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from harness_env.client import HarnessEnv
from tests.server_process import free_port
from tests.test_deploy_files import package_files, source_copy

pytestmark = pytest.mark.slow  # builds the wheel and installs it in a fresh venv: not in the fast tier

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
VERSION = PROJECT["version"]
# OpenEnv's validator looks for a `server` console script; `harness-env` is ours.
CONSOLE_SCRIPTS = {"harness-env": "harness_env.cli:main", "server": "harness_env.server.main:main"}
# Files of the repo root that the package never reads at run time (so the wheel need not ship them).
PROJECT_FILES = ("openenv.yaml", "pyproject.toml", "uv.lock")


def string_literals(source: str) -> set[str]:
    """The string constants of a module's code, docstrings left out (comments are not in the AST)."""
    tree = ast.parse(source)
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings}


def find_uv() -> list[str]:
    """The uv that ./dev uses (`python3 -m uv` of the Python the venv was made from), else any uv
    on PATH. uv is not a dependency of the project, so `sys.executable -m uv` normally fails."""
    candidates = [
        [os.environ["UV"]] if os.environ.get("UV") else None,  # set by `uv run`
        [sys.executable, "-m", "uv"],
        [getattr(sys, "_base_executable", sys.executable), "-m", "uv"],
        [shutil.which("uv")] if shutil.which("uv") else None,
        [shutil.which("python3"), "-m", "uv"] if shutil.which("python3") else None,
    ]
    for cmd in candidates:
        if cmd is None:
            continue
        try:
            if subprocess.run([*cmd, "--version"], capture_output=True, timeout=30).returncode == 0:
                return cmd
        except (OSError, subprocess.TimeoutExpired):
            continue
    pytest.fail("uv is needed to build and install the wheel: run ./dev test (it installs uv), or `python3 -m pip install uv`")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would point a child at the checkout or its venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    venv_bin = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    return {**env, "UV_PYTHON_DOWNLOADS": "never", **extra}


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, **kw)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p


@dataclass
class Installed:
    wheel: Path
    venv: Path
    cwd: Path  # a directory outside the checkout, with nothing importable in it
    source: list[Path]  # what the wheel must ship, from the tree it was built from
    timings: dict[str, float]

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Iterator[Installed]:
    uv, env, timings = find_uv(), clean_env(), {}
    base = tmp_path_factory.mktemp("wheel")
    try:
        started = time.monotonic()
        # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
        src = source_copy(base / "src")
        source = package_files(src)
        run([*uv, "build", "--wheel", "--python", sys.executable, "--out-dir", str(base / "dist"), str(src)], env=env, cwd=base)
        [wheel] = (base / "dist").glob("harness_env-*.whl")
        timings["build"] = time.monotonic() - started

        started = time.monotonic()
        req = base / "requirements.txt"
        run([*uv, "export", "--locked", "--no-dev", "--extra", "server", "--no-emit-project", "--quiet", "-o", str(req)], env=env, cwd=src)
        venv = base / "venv"
        run([*uv, "venv", "--quiet", "--python", sys.executable, str(venv)], env=env, cwd=base)
        run([*uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "-r", str(req), f"{wheel}[server]"], env=env, cwd=base)
        timings["install"] = time.monotonic() - started
        shutil.rmtree(src)
        (base / "cwd").mkdir()
        yield Installed(wheel=wheel, venv=venv, cwd=base / "cwd", source=source, timings=timings)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        print(f"\nwheel test timings: {', '.join(f'{k} {v:.1f}s' for k, v in timings.items())}")


def test_the_wheel_ships_every_module_and_data_file_of_the_package(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    shipped = {n.removeprefix("harness_env/") for n in names if n.startswith("harness_env/")}
    expected = {p.as_posix() for p in installed.source}
    assert "envs/harbor/__init__.py" in expected and "py.typed" in expected
    assert sorted(expected - shipped) == [], "missing from the wheel: pyproject's [tool.setuptools] packages or package-data"
    assert sorted(shipped - expected) == []  # nothing else: no tests, benchmarks or examples under harness_env/
    # The project files at the repo root are not read by the package (no string in its code, other
    # than docstrings, names one), so the wheel needs none of them.
    literals = {s for n in names if n.endswith(".py") for s in string_literals(zipfile.ZipFile(installed.wheel).read(n).decode())}
    assert [(f, s) for f in PROJECT_FILES for s in literals if f in s] == []

    dist_info = f"harness_env-{VERSION}.dist-info"
    assert f"{dist_info}/licenses/LICENSE" in names
    metadata = zipfile.ZipFile(installed.wheel).read(f"{dist_info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata and f"Version: {VERSION}" in metadata
    entry_points = zipfile.ZipFile(installed.wheel).read(f"{dist_info}/entry_points.txt").decode()
    for name, target in CONSOLE_SCRIPTS.items():
        assert f"{name} = {target}" in entry_points


def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    probe = "import json, sys, harness_env, harness_env.server.app; print(json.dumps([harness_env.__file__, sys.path]))"
    p = run([installed.bin("python"), "-c", probe], cwd=installed.cwd, env=clean_env())
    module_file, path = json.loads(p.stdout)
    assert Path(module_file).is_relative_to(installed.venv), module_file
    assert not any(entry and Path(entry).resolve().is_relative_to(ROOT) for entry in path), path
    for pth in (installed.venv / "lib").glob("python*/site-packages/*.pth"):  # an editable install is a .pth
        assert "__editable__" not in pth.name and str(ROOT) not in pth.read_text(), pth


def test_version(installed):
    p = run([installed.bin("harness-env"), "--version"], cwd=installed.cwd, env=clean_env())
    assert p.stdout.strip() == f"harness-env {VERSION}"


def test_serve_and_a_whitebox_rollout_over_http(installed, policy_server, tmp_path_factory):
    """The installed `harness-env serve` runs a rollout; this process runs the scripted policy and
    drives the server with the HTTP client."""
    policy_server.policy.scripts["m"] = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]
    sandbox_dir = Path(os.environ["HARNESS_ENV_SANDBOX_DIR"])  # conftest's: checked empty after the test
    # The server's TMPDIR (it must leave nothing there), with a short path: its capture socket lives
    # there and a Unix socket path has at most 107 bytes.
    server_tmp = tmp_path_factory.mktemp("wsrv")
    token, port = secrets.token_hex(16), free_port()
    url = f"http://127.0.0.1:{port}"
    env = clean_env(
        HARNESS_ENV_TOKEN=token,
        HARNESS_ENV_SANDBOX_DIR=str(sandbox_dir),
        TMPDIR=str(server_tmp),
        HARNESS_ENV_LOG_LEVEL="warning",
        HARNESS_ENV_ALLOWED_HOSTS="127.0.0.1,localhost",
    )
    log_path = server_tmp.parent / f"{server_tmp.name}.log"
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [installed.bin("harness-env"), "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=installed.cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 90
            while True:
                assert proc.poll() is None, f"the installed server exited:\n{log_path.read_text()}"
                assert time.monotonic() < deadline, f"the installed server did not come up:\n{log_path.read_text()}"
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            installed.timings["serve start"] = time.monotonic() - started

            started = time.monotonic()
            with HarnessEnv(url, token=token, timeout=180) as env_client:
                result = env_client.run_rollout(
                    harness="whitebox",
                    instruction="Create hello.txt containing hello.",
                    verify=["grep -qx hello hello.txt"],
                    base_url=policy_server.base_url,
                    model="m",
                    agent_timeout_s=60,
                )
                assert result.error is None, result.error
                assert result.reward == 1.0
                assert result.harness == "whitebox"
                assert [s.completion_token_ids for s in policy_server.policy.sent if s.tool_calls]  # the policy was called
                assert env_client.health()["rollouts_running"] == 0
            installed.timings["rollout"] = time.monotonic() - started
            # The other faces, whose files come from the dependencies the extra installs: the web
            # UI (Gradio) and the offline API docs (Swagger UI's files, from swagger-ui-bundle-v2).
            for path, media_type in [("/web/", "text/html"), ("/docs", "text/html"), ("/docs/assets/swagger-ui-bundle.js", "javascript")]:
                r = httpx.get(url + path, headers={"Authorization": f"Bearer {token}"}, timeout=90)
                assert r.status_code == 200 and media_type in r.headers["content-type"], (path, r.status_code, r.text[:300])
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode in (0, -15), log_path.read_text()
    assert sorted(p.name for p in server_tmp.iterdir()) == [], "the server left temporary files behind"
    assert "Traceback" not in log_path.read_text(), log_path.read_text()
