"""The Dockerfile and openenv.yaml cannot be built or deployed here (no Docker engine); these
tests check them against what they must agree with: the files they copy, the pinned versions, the
commands ./dev runs, the console script, the server's CLI, the Space's conventions (user 1000,
one port, a health check) and OpenEnv's validator. tests/test_wheel_install.py builds and runs the
wheel, which is what the image installs."""

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from harness_env import envs  # noqa: F401 - registers the harnesses: their pins are the table
from harness_env.cli import build_parser
from harness_env.core.toolchain import NODE_VERSION, pins
from tests import openenv_env

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PORT = 7860  # a Space's default app_port


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: continuation lines joined, comments dropped."""
    found, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # also a comment line inside a continuation, as Docker reads it
        if stripped.endswith("\\"):
            current += stripped[:-1].strip() + " "
            continue
        instruction, _, args = (current + stripped).partition(" ")
        found.append((instruction.upper(), args.strip()))
        current = ""
    assert current == "", "the Dockerfile ends inside a continuation"
    return found


INSTRUCTIONS = parse_dockerfile(DOCKERFILE)


def _instructions(name: str) -> list[str]:
    return [args for instruction, args in INSTRUCTIONS if instruction == name]


def _env() -> dict[str, str]:
    return dict(item.split("=", 1) for args in _instructions("ENV") for item in shlex.split(args))


def _copies() -> list[tuple[int, list[str]]]:
    """(position, sources) of each COPY (flags such as --chown dropped; the last word is the target)."""
    return [(i, [w for w in shlex.split(args) if not w.startswith("--")][:-1]) for i, (name, args) in enumerate(INSTRUCTIONS) if name == "COPY"]


def _uv_syncs() -> list[tuple[int, list[str]]]:
    """(position, argv) of each `uv sync` the Dockerfile runs."""
    found = []
    for i, (name, args) in enumerate(INSTRUCTIONS):
        if name == "RUN":
            for command in re.split(r"&&|;", args):
                argv = shlex.split(command)
                if argv[:2] == ["uv", "sync"]:
                    found.append((i, argv))
    return found


def _extras(argv: list[str]) -> set[str]:
    return {argv[i + 1] for i, a in enumerate(argv) if a == "--extra"}


def _ignore_pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker reads it: relative to the context root, `*` and `?` stay
    within one path component, `**` spans any number of them (also none)."""
    out, i = "", 0
    pattern = pattern.strip("/")
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        else:
            out += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
            i += 1
    return re.compile(out)


def dockerignored(rel: str) -> bool:
    """Whether .dockerignore keeps `rel` (a path relative to the repo) out of the build context:
    a pattern matches the path or one of its parent directories."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "exceptions (!) are not understood by this check"
    parts = Path(rel).parts
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    return any(_ignore_pattern(pattern).fullmatch(prefix) for pattern in patterns for prefix in prefixes)


def test_the_dockerfile_parser():
    text = "FROM x\n# a comment\nRUN a \\\n  # inside\n    && b\nenv A=1 \\\n    B=2\n"
    assert parse_dockerfile(text) == [("FROM", "x"), ("RUN", "a && b"), ("ENV", "A=1 B=2")]
    assert {i for i, _ in INSTRUCTIONS} <= {"FROM", "RUN", "USER", "ENV", "WORKDIR", "COPY", "EXPOSE", "HEALTHCHECK", "CMD"}
    for pattern, path, matches in [
        ("**/__pycache__", "__pycache__", True),
        ("**/__pycache__", "a/b/__pycache__", True),
        ("*.egg-info", "x.egg-info", True),
        ("*.egg-info", "a/x.egg-info", False),
        ("a*", "ab/c", False),
    ]:
        assert bool(_ignore_pattern(pattern).fullmatch(path)) is matches, (pattern, path)


def test_every_file_the_dockerfile_copies_exists_and_is_in_the_build_context():
    copies = _copies()
    assert copies
    for _, sources in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the repo"
            assert source == "." or not dockerignored(source), f"COPY {source}: excluded by .dockerignore"


def test_the_build_context_leaves_out_local_state_but_nothing_the_build_or_the_package_needs():
    for local in (".venv", ".git", ".venv/bin/python", "core/__pycache__", "harness_env.egg-info", ".pytest_cache", "tests/artifacts"):
        assert dockerignored(local), f".dockerignore must exclude {local}"
    needed = ["pyproject.toml", "uv.lock", ".python-version", PYPROJECT["project"]["readme"], *PYPROJECT["project"]["license-files"]]
    needed += [p.as_posix() for p in package_files()]
    assert [f for f in needed if dockerignored(f)] == []


def test_dependencies_are_installed_before_the_source_is_copied():
    """A code change rebuilds the last layers only: the dependency layer sees pyproject.toml,
    uv.lock (and .python-version) alone, and installs them without the project. Not README.md: a
    docs change would reinstall every dependency, and uv does not read it to install them."""
    syncs = _uv_syncs()
    assert len(syncs) == 2, "two `uv sync`s: the dependencies (--no-install-project) before `COPY . .`, the project after it"
    (deps_at, deps), (project_at, project) = syncs
    [(source_at, _)] = [(i, sources) for i, sources in _copies() if "." in sources]
    [(manifest_at, manifest)] = [(i, sources) for i, sources in _copies() if "." not in sources]
    assert manifest_at < deps_at < source_at < project_at
    assert {"pyproject.toml", "uv.lock"} <= set(manifest) <= {"pyproject.toml", "uv.lock", ".python-version"}
    assert "--no-install-project" in deps and "--no-install-project" not in project
    for argv in (deps, project):
        assert "--locked" in argv and "--no-dev" in argv  # exactly uv.lock's versions; no test tools
    assert _extras(deps) == _extras(project)
    # The image runs the project as its wheel, as tests/test_wheel_install.py does.
    assert "--no-editable" in project


def test_the_dockerfile_installs_what_dev_serve_installs():
    dev = (ROOT / "dev").read_text()
    # ./dev: `serve) setup <uv sync arguments>; exec ...`, and setup runs `uv sync --locked ... "${extras[@]}"`.
    serve = re.search(r"^\s*serve\)\s*setup\s+([^;]*);", dev, re.M)
    assert serve, "./dev serve no longer calls `setup <uv sync arguments>`: update this test"
    serve_args = shlex.split(serve.group(1))
    [sync] = [line for line in dev.splitlines() if "-m uv sync" in line and not line.lstrip().startswith("#")]
    assert "--locked" in sync and '"${extras[@]}"' in sync
    [(_, project)] = _uv_syncs()[1:]
    assert _extras(project) == _extras(serve_args) == {"server", "harbor"}
    assert "--no-dev" in serve_args and "--no-dev" in project
    assert _extras(project) <= set(PYPROJECT["project"]["optional-dependencies"])
    # Both install the harness CLIs the same way, after the Python packages.
    assert "harness-env install" in dev
    install_at = [i for i, (name, args) in enumerate(INSTRUCTIONS) if name == "RUN" and "harness-env install" in args]
    assert install_at and install_at[0] >= _uv_syncs()[1][0]
    # uv itself is pinned: the same Dockerfile builds the same image.
    assert re.search(r"\buv==\d+\.\d+\.\d+\b", DOCKERFILE), "pin uv (pip install uv==X.Y.Z)"


def test_the_docker_commands_of_the_docs_fit_the_image():
    """`docker run` as README.md and docs/ write it: the image's port published, a token set (the
    server refuses a public address without one), the image built from the repo root; and the
    install command docs/deploy.md quotes is the one the Dockerfile runs."""
    docs = {path: path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    runs = [(path.name, line) for path, text in docs.items() for line in text.splitlines() if "docker run" in line]
    assert runs, "README.md or docs/ should show how to run the image"
    for name, line in runs:
        argv = shlex.split(line.split("docker run", 1)[1])
        published = [argv[i + 1] for i, a in enumerate(argv) if a == "-p"]
        assert any(p.endswith(f":{PORT}") for p in published), (name, line)
        settings = [argv[i + 1].split("=", 1)[0] for i, a in enumerate(argv) if a == "-e"]
        assert "HARNESS_ENV_TOKEN" in settings or "HARNESS_ENV_ALLOW_UNAUTHENTICATED" in settings, (name, line)
    for name, text in ((p.name, t) for p, t in docs.items()):
        for build in re.findall(r"docker build ([^&\n`]*)", text):
            assert shlex.split(build)[-1] == ".", (name, build)  # the context is the repo root, where the Dockerfile is
        for quoted in re.findall(r"`(uv sync --locked[^`]*)`", text):
            project = _uv_syncs()[-1][1]
            argv = shlex.split(quoted)
            assert _extras(argv) == _extras(project) and {a for a in argv if a.startswith("--")} <= set(project), (name, quoted, project)


def test_harnesses_are_installed_from_the_pin_table_only():
    assert any("harness-env install" in run for run in _instructions("RUN"))
    # No version of a harness or of Node is written into the Dockerfile: one table rules.
    for pin in pins().values():
        assert pin.package not in DOCKERFILE
    assert NODE_VERSION not in DOCKERFILE and "npm install" not in DOCKERFILE


def test_it_runs_the_console_script_the_package_declares():
    scripts = PYPROJECT["project"]["scripts"]
    [cmd] = _instructions("CMD")
    argv = shlex.split(json.loads(cmd)[-1])  # CMD ["sh", "-c", "exec harness-env serve ..."]
    assert argv[:3] == ["exec", "harness-env", "serve"] and "harness-env" in scripts
    assert f"${{PORT:-{PORT}}}" in argv  # $PORT, else the port the image exposes
    args = build_parser().parse_args([a.replace(f"${{PORT:-{PORT}}}", str(PORT)) for a in argv[2:]])
    assert (args.command, args.host, args.port) == ("serve", "0.0.0.0", PORT)


def test_space_conventions():
    """A Space runs the image as uid 1000 and sends traffic to app_port (openenv.yaml's port)."""
    manifest = (ROOT / "openenv.yaml").read_text()
    assert re.search(rf"^port: {PORT}$", manifest, re.M)
    assert _instructions("EXPOSE") == [str(PORT)]
    env = _env()
    assert env["PORT"] == str(PORT)
    [health] = _instructions("HEALTHCHECK")
    assert "/health" in health and f"os.environ.get('PORT', '{PORT}')" in health
    # Not root: uid 1000, with a home of its own that holds everything the server writes.
    [user] = _instructions("USER")
    assert user not in ("root", "0")
    assert user == "1000" or any(re.search(rf"useradd\b.*--create-home.*--uid 1000 {user}\b", run) for run in _instructions("RUN"))
    home = env["HOME"]
    assert home == f"/home/{user}"
    for name in ("UV_CACHE_DIR", "NPM_CONFIG_CACHE", "HARNESS_ENV_TOOLS_DIR"):
        assert env[name].startswith(home + "/"), name
    [workdir] = _instructions("WORKDIR")
    assert workdir.startswith(home + "/")
    assert any(f"install -d -o {user} -g {user} {workdir}" in run for run in _instructions("RUN")), "the app directory must be the user's"
    assert all(f"--chown={user}" in args for _, args in INSTRUCTIONS if _ == "COPY")
    assert env["PATH"].startswith(f"{workdir}/.venv/bin:")
    assert "bubblewrap" in DOCKERFILE


def source_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked, and untracked but not ignored), copied to
    `dest`: what a clone holds, without local state (caches, test artifacts, build output) that
    changes while other processes run."""
    p = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    for rel in filter(None, p.stdout.split("\0")):
        src = ROOT / rel
        if src.is_file():  # a tracked file deleted in the working tree is skipped
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.mark.slow  # runs openenv validate in a process of its own
def test_openenv_validate_passes(tmp_path):
    # On a copy: the validator hashes the whole tree before and after, and the checkout's caches
    # (.pytest_cache, .hypothesis, tests/artifacts) change while tests run.
    src = source_copy(tmp_path / "src")
    # Runtime checks need a Docker build (no engine here): they are skipped, the verdict is WARN.
    # OpenEnv's own console script, from its venv (tests/openenv_env.py).
    p = openenv_env.cli("validate", str(src), cwd=src, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PASS  static.manifest" in p.stdout and "FAIL" not in p.stdout


# What the wheel ships: the repo root is the package, minus these top-level directories.
NOT_SHIPPED = frozenset({"tests", "bench", "examples", "build", "dist"})


def package_files(root: Path = ROOT) -> list[Path]:
    """What the wheel must ship, relative to the repo root (the package): every module, py.typed,
    and every other file inside a package directory (data read at run time). Not the tests,
    benchmarks, examples, docs (no module: not a package), hidden directories (.git, .venv, caches),
    build output, nor the project files at the root (pyproject.toml, openenv.yaml, ...).
    tests/test_wheel_install.py checks the built wheel against it."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(
            d for d in dirnames if not (d.startswith(".") or d == "__pycache__" or d.endswith(".egg-info") or (rel == Path(".") and d in NOT_SHIPPED))
        )
        found += [rel / f for f in filenames if not f.endswith(".pyc")]
    packages = {p.parent for p in found if p.suffix == ".py"} - {Path(".")}
    return sorted(p for p in found if p.suffix == ".py" or p == Path("py.typed") or any(d in packages for d in p.parents))


def test_every_package_of_the_source_tree_goes_into_the_wheel():
    """A package missing from pyproject's list is missing from the wheel: imports fail only in a
    non-editable install (pip install harness-env, a Docker image). This is the quick static check;
    tests/test_wheel_install.py builds the wheel and runs it."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(("harness_env", *p.parent.parts)) for p in package_files() if p.suffix == ".py"}
    assert "harness_env.envs.harbor" in found
    assert found - listed == set(), f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"


def test_the_rayservice_manifest_runs_the_app_as_harness_env_serve_ray_builds_it():
    """deploy/rayservice.yaml (KubeRay) cannot be applied here (no Kubernetes): its YAML, and the
    Serve config inside it, are parsed and checked against the code: the import path is the
    application builder, its args are ReplicaSettings, the deployment is the one ray_serve names,
    Ray's version is the pinned one, and the secrets come from a Secret, never a literal."""
    import importlib
    from importlib.metadata import version as dist_version

    import yaml

    from harness_env.server.ray import serve as ray_serve
    from harness_env.server.ray.settings import settings_from_args

    docs = list(yaml.safe_load_all((ROOT / "deploy" / "rayservice.yaml").read_text()))
    assert len(docs) == 1
    service = docs[0]
    assert (service["apiVersion"], service["kind"]) == ("ray.io/v1", "RayService")
    serve_config = yaml.safe_load(service["spec"]["serveConfigV2"])
    [app] = serve_config["applications"]
    module, _, name = app["import_path"].partition(":")
    assert getattr(importlib.import_module(module), name) is ray_serve.build
    settings = settings_from_args(app["args"])
    assert settings.token_required
    [deployment] = app["deployments"]
    assert deployment["name"] == ray_serve.DEPLOYMENT
    auto = deployment["autoscaling_config"]
    assert 1 <= auto["min_replicas"] <= auto["max_replicas"]
    cluster = service["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == dist_version("ray")
    pin = next(d for d in PYPROJECT["project"]["optional-dependencies"]["ray"] if d.startswith("ray[serve]"))
    assert pin.split("==")[1].rstrip(".*") in cluster["rayVersion"]
    pods = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for pod in pods:
        [container] = pod["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        for secret in ("HARNESS_ENV_STORE_URL", "HARNESS_ENV_TOKEN"):
            assert "value" not in env[secret] and env[secret]["valueFrom"]["secretKeyRef"]["name"] == "harness-env"
        assert serve_config["http_options"]["port"] in {p["containerPort"] for p in container["ports"]}
