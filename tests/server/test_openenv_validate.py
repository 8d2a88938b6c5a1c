"""OpenEnv conformance, checked with the real `openenv` package (0.10, in a venv of its own:
tests/openenv_env.py): its `openenv validate` CLI on the repo (static checks) and against a real
`harness-env serve` process (`--url`: every runtime criterion), the routes read with its own types,
and openenv.yaml held to the code it describes."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import httpx
import pytest
import yaml

import harness_env
from harness_env.core.catalog import CATALOG
from harness_env.core.distribution import package_version
from harness_env.core.reward import EFFICIENCY_SCALE, EFFICIENCY_WEIGHT, compute_reward, tool_efficiency_reward
from harness_env.core.sandbox.policy import LIMIT_FIELDS
from harness_env.families.svg_icon import judge as svg_judge
from harness_env.models import CommandResult, RolloutArgs, RolloutResult
from harness_env.server.openenv_routes import DESCRIPTION, ServerState
from tests import openenv_env
from tests.server_process import ServerProcess

REPO = Path(harness_env.__file__).resolve().parent
MANIFEST = yaml.safe_load((REPO / "openenv.yaml").read_text())
RUNTIME_CRITERIA = {"openapi_version_available", "health_endpoint", "metadata_endpoint", "schema_endpoint", "mcp_endpoint", "mode_endpoint_consistency"}
# Set by the server for the commands it runs in a sandbox, not by a deployer.
SANDBOX_INTERNAL = {
    "HARNESS_ENV_REWARD_FILE",
    "HARNESS_ENV_SANDBOX_ID",
    "HARNESS_ENV_CAPTURE_KEY",
    "HARNESS_ENV_WORKDIR",
    "HARNESS_ENV_VERIFIER_DIR",
    "HARNESS_ENV_API_KEY",
}
# What the validator hashes but never reads; a concurrent test run rewriting them would make the
# source digest fail ("changed before it could be read"), and walking .venv takes most of a minute.
NOT_SOURCE = (".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "*.egg-info", "node_modules", "artifacts")


def openenv_cli(*args: str) -> tuple[int, str]:
    """`openenv ARGS`, OpenEnv's own console script in its venv: the exit code and what it printed
    (stdout, then stderr)."""
    run = openenv_env.cli(*args)
    return run.returncode, run.stdout + run.stderr


def openenv_json(*args: str) -> tuple[int, dict]:
    """`openenv ARGS --json`: the exit code and the report (stdout is the JSON alone)."""
    run = openenv_env.cli(*args, "--json")
    assert run.stdout.strip(), run.stderr
    return run.returncode, json.loads(run.stdout)


@pytest.fixture(scope="module")
def server(module_server):
    return module_server


def _package_source() -> str:
    """The text of every Python file of the package: the repo root minus tests, benchmarks and examples."""
    skip = {"tests", "bench", "examples", ".venv", ".git", "__pycache__"}
    texts = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in skip]  # pruned, not walked (.venv is large)
        texts += [Path(root, f).read_text() for f in files if f.endswith(".py")]
    return "\n".join(texts)


# -- openenv validate -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """The repo's source tree as `openenv push` would see it, copied so nothing changes under the
    validator (it hashes the tree before and after)."""
    copy = tmp_path_factory.mktemp("package") / "harness-env"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(*NOT_SOURCE), symlinks=False)
    return copy


def test_static_validation_passes_on_the_repo(package: Path) -> None:
    code, report = openenv_json("validate", str(package), "--level", "static")
    assert code == 0, report
    results = {r["check_id"]: r["status"] for r in report["results"]}
    assert results == {"static.manifest": "pass"}, report
    assert report["verdict"] == "pass" and report["manifest"]["name"] == "harness-env"
    assert report["manifest"]["reward"]["range"] == MANIFEST["validation"]["reward"]["range"]


def test_default_validation_without_docker_fails_nothing(package: Path) -> None:
    """Plain `openenv validate` (up to the semantic level): the runtime and semantic checks of a
    package need a `validation.execution` plan and a Docker build, which this environment does not
    declare (its runtime face is checked by `--url` below): they are skipped, nothing fails (exit 0)."""
    code, report = openenv_json("validate", str(package))
    assert code == 0, report
    statuses = {r["check_id"]: r["status"] for r in report["results"]}
    assert statuses.pop("static.manifest") == "pass" and set(statuses.values()) == {"skip"}, statuses
    startup = next(r for r in report["results"] if r["check_id"] == "runtime.startup")
    assert startup["evidence"] == ["missing validation.execution declaration and runtime plan"]
    assert report["verdict"] == "warn"


def test_static_validation_fails_a_broken_manifest(tmp_path: Path) -> None:
    """The check above can fail: the same validator refuses a range that is not increasing."""
    broken = {**MANIFEST, "validation": {**MANIFEST["validation"], "reward": {"range": [1.0, 1.0], "floor_margin": 0.1}}}
    (tmp_path / "openenv.yaml").write_text(yaml.safe_dump(broken))
    code, output = openenv_cli("validate", str(tmp_path), "--level", "static")
    assert code == 1 and "strictly increasing" in output, output


def test_runtime_validation_passes_every_criterion(server: ServerProcess) -> None:
    code, report = openenv_json("validate", "--url", server.url)
    failed = [c for c in report["criteria"] if not c["passed"]]
    assert code == 0 and report["passed"] and not failed, failed
    assert {c["id"] for c in report["criteria"]} == RUNTIME_CRITERIA
    assert report["mode"] == "production"  # stateless: no /reset, /step, /state
    assert report["standard_version"] == package_version()


def test_against_a_server_with_a_token_only_what_acts_is_closed(start_server) -> None:
    """A Space must have a token, and the validator sends none. What describes the API runs
    nothing and is open; /mcp runs rollouts and stays closed (the one criterion that then fails)."""
    s = start_server(env={"HARNESS_ENV_TOKEN": "tok"})
    _, report = openenv_json("validate", "--url", s.url)
    assert [c["id"] for c in report["criteria"] if not c["passed"]] == ["mcp_endpoint"]
    for method, path in (("GET", "/harnesses"), ("POST", "/rollout"), ("POST", "/mcp"), ("GET", "/web/config"), ("GET", "/catalog")):
        assert httpx.request(method, s.url + path, json={}).status_code == 401, path


# -- the routes, as OpenEnv's own types read them -------------------------------------------------


@pytest.fixture(scope="module")
def as_openenv_reads(server: ServerProcess) -> dict:
    """/health, /metadata and /schema as the server answers them, and as OpenEnv's own types read
    them (HealthStatus, EnvironmentMetadata, SchemaResponse: the last two forbid extra fields)."""
    answers = {name: httpx.get(f"{server.url}/{name}").json() for name in ("health", "metadata", "schema")}
    return {"served": answers, "read": openenv_env.check("env_server_types", answers)}


def test_health_is_healthy_and_keeps_the_load_fields(as_openenv_reads: dict) -> None:
    health = as_openenv_reads["served"]["health"]
    assert as_openenv_reads["read"]["health_status"] == "HEALTHY"
    state = ServerState.model_validate({k: v for k, v in health.items() if k != "status"})
    assert state.rollouts_running == 0 and state.max_concurrent >= 1 and "whitebox" in state.harnesses


def test_metadata_is_openenvs_environment_metadata(as_openenv_reads: dict) -> None:
    meta = as_openenv_reads["read"]["metadata"]
    assert meta["name"] == MANIFEST["name"] == "harness-env"
    assert meta["description"] == MANIFEST["description"] == DESCRIPTION
    assert meta["version"] == str(MANIFEST["version"]) == package_version()
    assert meta["readme_content"] and "harness-env" in meta["readme_content"]  # the README, from the installed metadata


def test_schema_is_openenvs_schema_response(as_openenv_reads: dict) -> None:
    schemas = as_openenv_reads["read"]["schema"]
    assert schemas["action"] == json.loads(json.dumps(RolloutArgs.model_json_schema()))
    assert schemas["observation"] == json.loads(json.dumps(RolloutResult.model_json_schema(mode="serialization")))
    assert schemas["state"] == json.loads(json.dumps(ServerState.model_json_schema(mode="serialization")))
    assert {"reward", "proxy_turns", "error"} <= set(schemas["observation"]["properties"])


def test_mcp_answers_openenvs_probe_and_lists_the_declared_tools(server: ServerProcess) -> None:
    probe = httpx.post(server.url + "/mcp", json={})  # what the validator sends
    assert probe.status_code == 200 and probe.json()["jsonrpc"] == "2.0"
    listed = httpx.post(server.url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=30).json()
    served = {t["name"] for t in listed["result"]["tools"]}
    assert served == {t["name"] for t in MANIFEST["tools"]} == set(MANIFEST["validation"]["capabilities"]["declared_tools"])
    assert served == {"run_rollout", "list_harnesses", "list_tasks", "catalog", "submit_rollout", "get_rollout"}


# -- openenv.yaml held to the code ----------------------------------------------------------------


def test_reward_range_holds_for_every_reward_mode() -> None:
    low, high = MANIFEST["validation"]["reward"]["range"]
    # correctness: passed/total verify commands.
    for total in range(1, 12):
        for passed in range(total + 1):
            results = [CommandResult(cmd="c", exit_code=0 if i < passed else 1) for i in range(total)]
            reward, source, _ = compute_reward(results, None)
            assert source == "verify_ratio" and low <= reward <= high
    # tool_efficiency over any correctness in [0, 1] and any tool-call count (or none verified).
    grid = [i / 20 for i in range(21)]
    rewards = [tool_efficiency_reward(c, n)[0] for c in grid for n in [None, *range(0, 2000)]]
    assert min(rewards) >= low and max(rewards) <= high
    # The range is tight: its top is the tool-efficiency maximum (one verified tool call).
    assert max(rewards) == high == 1 + EFFICIENCY_WEIGHT * EFFICIENCY_SCALE / (EFFICIENCY_SCALE + 1)
    # An oracle (correctness 1, no verified tool calls) passes the oracle check.
    assert tool_efficiency_reward(1.0, None)[0] >= high - MANIFEST["validation"]["reward"]["oracle_tolerance"]


def test_manifest_declares_the_judge_the_svg_family_reads() -> None:
    names = {
        svg_judge.ENV_BASE_URL,
        svg_judge.ENV_MODEL,
        svg_judge.ENV_API_KEY,
        svg_judge.ENV_TIMEOUT,
        svg_judge.ENV_CONCURRENCY,
        svg_judge.ENV_REQUEST_OPTIONS,
    }
    assert set(MANIFEST["judge"]["variables"]) == names
    assert {v["name"] for v in MANIFEST["environment"]["judge"]} == names
    assert MANIFEST["validation"]["capabilities"].get("llm_judged", False) is False  # only one family; see openenv.yaml


def test_manifest_declares_every_variable_the_package_reads() -> None:
    declared = {v["name"]: v for group in MANIFEST["environment"].values() for v in group}
    source = _package_source()
    read = set(re.findall(r"HARNESS_ENV_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])", source)) - SANDBOX_INTERNAL
    read |= {f"HARNESS_ENV_MAX_{f.upper()}" for f in LIMIT_FIELDS}  # built as HARNESS_ENV_MAX_<option>
    read |= {var for e in CATALOG.values() for var in (e.url_var, e.key_var, e.model_var)}
    assert sorted(read - set(declared)) == [], "read by the package but not declared in openenv.yaml"
    stale = [name for name in declared if name not in source and name not in read]
    assert stale == [], "declared in openenv.yaml but read nowhere in the package"
    secrets = {name for name, v in declared.items() if v.get("secret")}
    assert secrets == {name for name in declared if re.search(r"KEY|TOKEN", name)} | {"HARNESS_ENV_STORE_URL"}  # its password
    assert "variables" not in MANIFEST  # `openenv push` would set those on a Space, secrets in the clear
