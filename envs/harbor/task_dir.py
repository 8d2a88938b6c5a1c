"""Harbor task directories: read one (as Harbor 0.26 does), and write one from our uniform Task.

A Harbor task directory (harbor/models/task/paths.py, TaskPaths):

    task.toml        [agent].timeout_sec, [verifier].timeout_sec, [environment].build_timeout_sec,
                     [environment].docker_image / workdir / os, ...  (harbor/models/task/config.py)
    instruction.md   what the agent gets (leading "canary" comment lines are stripped)
    environment/     Dockerfile (or docker-compose.yaml, ...); optional when docker_image is set
    tests/test.sh    run by Harbor's verifier at /tests; writes /logs/verifier/reward.{json,txt}
    solution/solve.sh  optional, run by Harbor's oracle agent at /solution

Parsing goes through Harbor's own `harbor.models.task.task.Task` (so whatever Harbor rejects, we
reject, with its message); only the values a rollout needs are kept in `HarborTask`.

A uniform Task becomes a task directory like this (`task_to_task_dir`):

    environment/files/<path>   the Task's files, verbatim
    environment/setup.sh       the Task's setup commands, in order, from the workdir, stopping at
                               the first failure; each has setup_timeout_s, as natively
    environment/Dockerfile     FROM <base_image>; copies files/ into the workdir and runs setup.sh
                               at build time, for Harbor's container providers
    tests/test.sh              runs the verify commands in order from the workdir (each in its own
                               bash with verify_timeout_s, as natively: a hung command fails, the
                               others still run; all run whatever the others did), then writes passed/total to
                               /logs/verifier/reward.txt unless a verify command already wrote a
                               reward (reward.json, or one number in reward.txt, the file
                               $HARNESS_ENV_REWARD_FILE names): the rule of core/reward.py
    task.toml                  timeouts (the scripts' budgets: per-command timeout x commands),
                               workdir, metadata.harness_env (task_id, counts)

Our own `local` Harbor environment ignores the Dockerfile: it writes environment/files into the
workspace and runs environment/setup.sh there (HarborTask.files_dir / setup_script). Each verify
command's exit code, duration and whether it timed out are also appended to /logs/verifier/verify_results.jsonl, so verify_results can
be filled in the result. A Task without verify commands gives a test.sh that writes no reward (our
rule: no reward), which Harbor's own verifier reports as RewardFileNotFoundError.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_env.core.errors import InvalidRequestError, ToolMissingError
from harness_env.models import Task

DEFAULT_WORKDIR = "/app"
DEFAULT_BASE_IMAGE = "ubuntu:24.04"
FILES_DIRNAME = "files"
SETUP_SCRIPT = "setup.sh"
VERIFY_RESULTS_FILE = "verify_results.jsonl"
REWARD_FILE_ENV = "HARNESS_ENV_REWARD_FILE"
# After a command's timeout, `timeout` sends TERM, then KILL this much later.
KILL_GRACE_S = 5
# Room in Harbor's verifier/build timeout for its own work around the script (uploads, log copies).
SCRIPT_MARGIN_S = 30
# Microseconds since the epoch (bash >= 5 has EPOCHREALTIME; older ones fall back to whole seconds).
NOW_US_FN = '_now_us() { local t="${EPOCHREALTIME:-$SECONDS.000000}"; echo "${t/[.,]/}"; }'


def script_budget(per_command_s: float, commands: int) -> float:
    """What a generated script may take in all: each command its own timeout plus the kill grace,
    plus a margin. Harbor's verifier and build timeouts are set to this, so a hung command fails
    alone (as natively) instead of timing out the whole script."""
    n = max(commands, 1)
    return float(per_command_s) * n + KILL_GRACE_S * n + SCRIPT_MARGIN_S


def _timeout_prefix(seconds: float) -> str:
    return f"timeout -k {KILL_GRACE_S} {float(seconds)!r}"


def _timed(label: str, cmd: str, seconds: float, *, workdir_var: str | None = None) -> list[str]:
    """Lines that announce `label`, run `cmd` in its own bash under its timeout (from $`workdir_var`,
    in a subshell, when given) and then set $rc, $took (microseconds) and $timed_out: exit 124
    (TERM) or 137 (KILL after the grace), and past the limit; a quick `exit 124` is the command's own."""
    run = f"{_timeout_prefix(seconds)} bash -c {shlex.quote(cmd)}"
    if workdir_var:
        run = f'(cd "${workdir_var}" && {run})'
    limit_us = int(float(seconds) * 1_000_000)
    return [
        f"echo '--- {label}'",
        "start=$(_now_us)",
        run,
        "rc=$? took=$(( $(_now_us) - start )) timed_out=false",
        f'if {{ [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; }} && [ "$took" -ge {limit_us} ]; then timed_out=true; fi',
    ]


@dataclass(frozen=True)
class HarborTask:
    """What a rollout needs from a Harbor task directory."""

    path: Path
    name: str
    instruction: str
    agent_timeout_s: float | None  # None: the task sets none (Harbor then uses the agent's default)
    verifier_timeout_s: float
    build_timeout_s: float
    docker_image: str | None
    dockerfile: Path | None
    environment_dir: Path | None
    workdir: str | None
    os: str
    tests_dir: Path
    test_script: Path
    solution_dir: Path | None
    solve_script: Path | None
    verifier_env: dict[str, str] = field(default_factory=dict)
    environment_env: dict[str, str] = field(default_factory=dict)
    # Written by task_to_task_dir (our convention; absent in other Harbor tasks):
    files_dir: Path | None = None
    setup_script: Path | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def harbor_task_model():
    """Harbor's Task model; ToolMissingError (naming the extra) when Harbor is not installed."""
    try:
        from harbor.models.task.task import Task as HarborTaskModel
    except ImportError as e:  # the optional extra is not installed
        raise ToolMissingError("Harbor is not installed: install the extra with `uv sync --extra harbor` (harbor==0.26.0)") from e
    return HarborTaskModel


def load_task_dir(path: str | Path) -> HarborTask:
    """Read a Harbor task directory. Raises InvalidRequestError naming what is missing or wrong."""
    HarborTaskModel = harbor_task_model()
    task_dir = Path(path).expanduser()
    if not task_dir.is_dir():
        raise InvalidRequestError(f"Harbor task directory {str(task_dir)!r} does not exist or is not a directory")
    config_path = task_dir / "task.toml"
    if not config_path.is_file():
        raise InvalidRequestError(f"Harbor task directory {str(task_dir)!r} has no task.toml")
    if not (task_dir / "instruction.md").is_file():
        # Harbor reads instruction.md before it checks tests/; say this first, as the likelier slip.
        try:
            import tomllib

            multi_step = bool(tomllib.loads(config_path.read_text()).get("steps"))
        except (OSError, ValueError):
            multi_step = False
        if not multi_step:
            raise InvalidRequestError(f"Harbor task directory {str(task_dir)!r} has no instruction.md")
    try:
        ht = HarborTaskModel(task_dir)
    except FileNotFoundError as e:  # missing tests/test.sh (Harbor's message names the path)
        raise InvalidRequestError(f"invalid Harbor task directory: {e}") from e
    except (ValueError, OSError, RuntimeError) as e:  # TOML errors, pydantic errors, path escapes
        raise InvalidRequestError(f"invalid Harbor task directory {str(task_dir)!r}: {e}") from e
    if ht.has_steps:
        raise InvalidRequestError(f"Harbor task {ht.name!r} is a multi-step task ([[steps]] in task.toml); only single-step tasks are supported")
    cfg = ht.config
    paths = ht.paths
    test_script = paths.discovered_test_path_for(cfg.environment.os)
    if test_script is None:  # bundled tests in a separate verifier environment
        raise InvalidRequestError(f"Harbor task {ht.name!r} has no tests/test.sh (tests bundled in a verifier environment are not supported)")
    env_dir = paths.environment_dir if paths.environment_dir.is_dir() else None
    dockerfile = env_dir / "Dockerfile" if env_dir and (env_dir / "Dockerfile").is_file() else None
    files_dir = env_dir / FILES_DIRNAME if env_dir and (env_dir / FILES_DIRNAME).is_dir() else None
    setup = env_dir / SETUP_SCRIPT if env_dir and (env_dir / SETUP_SCRIPT).is_file() else None
    solve = paths.discovered_solve_path_for(cfg.environment.os)
    return HarborTask(
        path=paths.task_dir,
        name=ht.name,
        instruction=ht.instruction,
        agent_timeout_s=cfg.agent.timeout_sec,
        verifier_timeout_s=cfg.verifier.timeout_sec,
        build_timeout_s=cfg.environment.build_timeout_sec,
        docker_image=cfg.environment.docker_image,
        dockerfile=dockerfile,
        environment_dir=env_dir,
        workdir=cfg.environment.workdir,
        os=cfg.environment.os.value,
        tests_dir=paths.tests_dir,
        test_script=test_script,
        solution_dir=paths.solution_dir if paths.solution_dir.is_dir() else None,
        solve_script=solve,
        verifier_env=dict(cfg.verifier.env),
        environment_env=dict(cfg.environment.env),
        files_dir=files_dir,
        setup_script=setup,
        metadata=dict(cfg.metadata),
    )


def check_split(split: str) -> None:
    """A split names one subdirectory of a dataset, never a path."""
    if "/" in split or split in (".", ".."):
        raise InvalidRequestError(f"split {split!r} must be a plain subdirectory name")


def find_task_in_dataset(dataset_dir: str | Path, split: str | None, task_index: int) -> Path:
    """The `task_index`-th task of a local Harbor dataset directory.

    Harbor 0.26 lists a local dataset as `sorted(dataset_dir.iterdir())` kept where
    `Task.is_valid_dir(path)` (harbor/models/job/config.py, _get_local_task_configs); we index that
    same list. Harbor has no splits: a non-empty `split` names a subdirectory of the dataset
    (e.g. dataset/train/<task>/), which must exist."""
    HarborTaskModel = harbor_task_model()
    root = Path(dataset_dir).expanduser()
    if not root.is_dir():
        raise InvalidRequestError(f"Harbor dataset directory {str(root)!r} does not exist or is not a directory")
    if split:
        check_split(split)
        if not (root / split).is_dir():
            splits = sorted(p.name for p in root.iterdir() if p.is_dir() and not HarborTaskModel.is_valid_dir(p))
            raise InvalidRequestError(f"Harbor dataset {str(root)!r} has no split {split!r}; its subdirectories are {splits}")
        root = root / split
    tasks = [p for p in sorted(root.iterdir()) if HarborTaskModel.is_valid_dir(p)]
    if not tasks:
        raise InvalidRequestError(f"no Harbor task directories in {str(root)!r}")
    if not 0 <= task_index < len(tasks):
        raise InvalidRequestError(f"task_index {task_index} is out of range: {str(root)!r} holds {len(tasks)} tasks (0..{len(tasks) - 1})")
    return tasks[task_index]


def _toml_str(s: str) -> str:
    import json

    return json.dumps(s)  # a JSON string is a valid TOML basic string


def build_test_sh(verify: list[str], workdir: str, command_timeout_s: float) -> str:
    """tests/test.sh for the verify commands (pure, for tests)."""
    lines = [
        "#!/usr/bin/env bash",
        "# Generated by harness-env from a uniform Task: runs its verify commands and writes the reward.",
        "set -u",
        # Overridable so an environment without Harbor's fixed paths (and the tests) can run it.
        'VERIFIER_DIR="${HARNESS_ENV_VERIFIER_DIR:-/logs/verifier}"',
        f'WORKDIR="${{HARNESS_ENV_WORKDIR:-{workdir}}}"',
        'mkdir -p "$VERIFIER_DIR"',
        "# The agent cannot forge a reward: whatever is there before verify runs is dropped.",
        'rm -rf -- "$VERIFIER_DIR/reward.txt" "$VERIFIER_DIR/reward.json"',
        f'export {REWARD_FILE_ENV}="$VERIFIER_DIR/reward.txt"',
        f'RESULTS="$VERIFIER_DIR/{VERIFY_RESULTS_FILE}"',
        ': > "$RESULTS"',
        "passed=0",
        f"total={len(verify)}",
        NOW_US_FN,
    ]
    for i, cmd in enumerate(verify):
        lines += [
            *_timed(f"verify #{i + 1}", cmd, command_timeout_s, workdir_var="WORKDIR"),
            '[ "$rc" -eq 0 ] && passed=$((passed + 1))',
            f'printf \'{{"index": {i}, "exit_code": %d, "duration_s": %d.%06d, "timed_out": %s}}\\n\' '
            '"$rc" $((took / 1000000)) $((took % 1000000)) "$timed_out" >> "$RESULTS"',
        ]
    lines += [
        "# A reward file that is not a regular file (a link, a FIFO, a directory) is no reward: dropped",
        "# before anything reads it (test -f follows links; grep would wait on a FIFO for ever).",
        "for f in reward.json reward.txt; do",
        '  if [ -L "$VERIFIER_DIR/$f" ] || { [ -e "$VERIFIER_DIR/$f" ] && [ ! -f "$VERIFIER_DIR/$f" ]; }; then rm -rf -- "$VERIFIER_DIR/$f"; fi',
        "done",
        "# A reward a verify command wrote wins (reward.json, or one finite-looking number in reward.txt).",
        'if [ -s "$VERIFIER_DIR/reward.json" ]; then exit 0; fi',
        f'if [ -f "${REWARD_FILE_ENV}" ] && [ "$(grep -c . "${REWARD_FILE_ENV}")" -eq 1 ] '
        f"&& grep -Eq '^[[:space:]]*[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?[[:space:]]*$' \"${REWARD_FILE_ENV}\"; then exit 0; fi",
        'rm -f "$VERIFIER_DIR/reward.txt"',
        'if [ "$total" -gt 0 ]; then',
        '  awk -v p="$passed" -v t="$total" \'BEGIN { printf "%.17g\\n", p / t }\' > "$VERIFIER_DIR/reward.txt"',
        "fi",
        "exit 0",
        "",
    ]
    return "\n".join(lines)


GENERATED_SETUP = "# Generated by harness-env from a uniform Task: its setup commands, in order, in the workdir."


def is_converted(env_dir: Path) -> bool:
    """Whether `env_dir` is the environment of a task written by task_to_task_dir (its setup.sh is
    ours): its files and setup are applied by the local environment, its Dockerfile never built."""
    try:
        with open(env_dir / SETUP_SCRIPT, "rb") as f:
            return GENERATED_SETUP.encode() in f.read(4096)
    except OSError:
        return False


def build_setup_sh(setup: list[str], workdir: str, command_timeout_s: float) -> str:
    """environment/setup.sh for the setup commands (pure, for tests)."""
    lines = ["#!/usr/bin/env bash", GENERATED_SETUP, f"cd {shlex.quote(workdir)} || exit 1", NOW_US_FN]
    # Not `set -e`: each command's exit is checked by hand, so a timeout can be told from a failure.
    for i, cmd in enumerate(setup):
        lines += [
            *_timed(f"setup #{i + 1}", cmd, command_timeout_s),
            f'if [ "$timed_out" = true ]; then echo "setup command #{i + 1} timed out after {float(command_timeout_s)!r}s" >&2; fi',
            'if [ "$rc" -ne 0 ]; then exit "$rc"; fi',
        ]
    return "\n".join(lines) + "\n"


def build_dockerfile(base_image: str, workdir: str) -> str:
    return "\n".join(
        [
            f"FROM {base_image}",
            f"WORKDIR {workdir}",
            f"COPY {FILES_DIRNAME}/ {workdir}/",
            f"COPY {SETUP_SCRIPT} /harness-env-setup.sh",
            "RUN bash /harness-env-setup.sh",
            "",
        ]
    )


def build_task_toml(task: Task, *, agent_timeout_s: float, verify_timeout_s: float, setup_timeout_s: float, workdir: str) -> str:
    meta_id = f"task_id = {_toml_str(task.task_id)}\n" if task.task_id else ""
    return (
        'schema_version = "1.4"\n\n'
        "[metadata]\n"
        'source = "harness-env"\n\n'
        "[metadata.harness_env]\n"
        f"{meta_id}"
        f"setup_commands = {len(task.setup)}\n"
        f"verify_commands = {len(task.verify)}\n\n"
        "[agent]\n"
        f"timeout_sec = {float(agent_timeout_s)!r}\n\n"
        "[verifier]\n"
        f"timeout_sec = {script_budget(verify_timeout_s, len(task.verify))!r}\n\n"
        "[environment]\n"
        f"build_timeout_sec = {script_budget(setup_timeout_s, len(task.setup))!r}\n"
        f"workdir = {_toml_str(workdir)}\n"
    )


def task_to_task_dir(
    task: Task,
    out_dir: str | Path,
    *,
    agent_timeout_s: float,
    verify_timeout_s: float,
    setup_timeout_s: float = 300.0,
    workdir: str = DEFAULT_WORKDIR,
    base_image: str = DEFAULT_BASE_IMAGE,
) -> Path:
    """Write `task` as a Harbor task directory at `out_dir` (created; must be empty if it exists)."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidRequestError(f"{str(out)!r} exists and is not an empty directory")
    if not workdir.startswith("/") or any(c in workdir for c in '"$`\\{} \t\n'):
        raise InvalidRequestError(f"workdir must be a plain absolute path, got {workdir!r}")
    env_dir, tests_dir, files_dir = out / "environment", out / "tests", out / "environment" / FILES_DIRNAME
    files_dir.mkdir(parents=True)
    tests_dir.mkdir()
    for rel, content in task.files.items():  # paths were normalised and checked by Task
        target = files_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    (env_dir / SETUP_SCRIPT).write_text(build_setup_sh(task.setup, workdir, setup_timeout_s))
    (env_dir / "Dockerfile").write_text(build_dockerfile(base_image, workdir))
    test_sh = tests_dir / "test.sh"
    test_sh.write_text(build_test_sh(task.verify, workdir, verify_timeout_s))
    test_sh.chmod(0o755)
    (out / "instruction.md").write_text(task.instruction)
    (out / "task.toml").write_text(
        build_task_toml(task, agent_timeout_s=agent_timeout_s, verify_timeout_s=verify_timeout_s, setup_timeout_s=setup_timeout_s, workdir=workdir)
    )
    return out
