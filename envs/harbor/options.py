"""Harbor's own options (HarborHarness.options_model) and what it reports, declared once: the CLI's
Harbor flags, the MCP schema's and the web form's Harbor controls are derived from these fields.

The hooks say what the fields alone cannot: `harness-env run --task DIR` runs a Harbor task or
dataset directory (and Harbor's flags mean harness harbor), `harness-env harbor-tasks` lists a
dataset, and the web form offers Harbor's agents and sandboxes as dropdowns. Nothing here imports
Harbor itself, config.py or resolve.py at module level (they import this module through models).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from harness_env.models.base import bounded_mapping, check_text
from harness_env.models.options import DEFAULT_HARNESS, HARNESS_OPTIONS, NAMED_TASK_INSTRUCTION, HarnessOptions, option
from harness_env.models.results import DatasetTaskInfo, HarnessRunInfo

__all__ = ["HARBOR_INSTRUCTION_PLACEHOLDER", "HARBOR_NAME_PATTERN", "HarborOptions", "HarborRunInfo", "HarborTaskInfo"]

HARBOR_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
HARBOR_INSTRUCTION_PLACEHOLDER = NAMED_TASK_INSTRUCTION  # the former name
HarborTaskInfo = DatasetTaskInfo  # the former name: one task of a dataset, as list_tasks shows it
TASKS_DIR_VAR = "HARNESS_ENV_HARBOR_TASKS_DIR"
HARNESS_NAME = "harbor"  # HarborHarness.name (harness.py imports this module)
FORMER_KEY = "harbor"  # where a request once put these options (upgrade_request)
DEFAULT_AGENT = "pi"
LOCAL_SANDBOX = "local"
# What a remote caller may set: options that change the agent's behaviour, not what it reads on
# the server (prompt_template_path, config, ... name server files) or what the provider allocates.
REMOTE_AGENT_KWARGS = frozenset({"version", "reasoning_effort", "thinking", "max_turns"})
_ON_SERVER = f"on a server, relative to its ${TASKS_DIR_VAR}"


class HarborOptions(HarnessOptions):
    """Harbor runs the rollout as a Harbor trial: Harbor's agent in a Harbor environment (the
    sandbox), graded by Harbor's verifier. The task is `task_dir` (one Harbor task directory) or task
    `task_index` of the dataset directory `dataset` (optionally inside its subdirectory `split`);
    on a server both are paths under its `HARNESS_ENV_HARBOR_TASKS_DIR`. With neither, the request's
    own task (instruction, setup, verify, files) is converted into a Harbor task; a named Harbor
    task brings its own instruction. The local sandbox runs pi, opencode, oracle and nop; other
    agents install themselves and need a provider sandbox."""

    label: ClassVar[str] = "Harbor"
    names_task_hint: ClassVar[str] = "harbor.task_dir or harbor.dataset names a Harbor task"

    task_dir: str | None = option(
        None,
        f"a Harbor task directory (task.toml, instruction.md, tests/); {_ON_SERVER}",
        group="harness",
        cli="--task",
        title="task dir (empty: the task of this form)",
        min_length=1,
        max_length=1024,
    )
    dataset: str | None = option(
        None,
        f"a dataset directory of Harbor task directories; {_ON_SERVER}",
        group="harness",
        cli="--task",
        title="or a dataset dir",
        min_length=1,
        max_length=1024,
    )
    split: str | None = option(
        None,
        "the subdirectory of the dataset holding its tasks (Harbor has no splits of its own)",
        group="harness",
        title="split (a subdirectory)",
        min_length=1,
        max_length=128,
        pattern=HARBOR_NAME_PATTERN,
    )
    task_index: int = option(
        0,
        "which task of the dataset, in Harbor's order (sorted names; see list_tasks)",
        group="harness",
        title="task index in the dataset",
        ge=0,
        le=10_000_000,
    )
    agent: str = option(
        DEFAULT_AGENT,
        "the Harbor agent: pi, opencode, oracle, nop, terminus-2, mini-swe-agent, ... (one that speaks chat completions)",
        group="harness",
        title="Harbor agent",
        min_length=1,
        max_length=64,
        pattern=HARBOR_NAME_PATTERN,
    )
    agent_kwargs: dict[str, Any] = option(
        {}, f"Harbor's options for the agent (a remote caller may set only {', '.join(sorted(REMOTE_AGENT_KWARGS))})", group="harness", title="agent options"
    )
    sandbox: str = option(
        LOCAL_SANDBOX,
        "the Harbor environment: local (ours, bubblewrap) or a provider: docker, daytona, e2b, modal, runloop, gke, ...",
        group="harness",
        title="sandbox",
        min_length=1,
        max_length=64,
        pattern=HARBOR_NAME_PATTERN,
    )
    sandbox_kwargs: dict[str, Any] = Field(
        {},
        description="the provider's own options (trusted callers only: the CLI, in-process)",
        json_schema_extra={"group": "harness", "remote": False},
        title="sandbox options",
    )
    reward_key: str | None = option(
        None,
        "which entry of the verifier's reward.json map is the reward; none: its only key, else `reward`",
        group="harness",
        title="reward key (reward.json map)",
        min_length=1,
        max_length=256,
    )

    @field_validator("agent_kwargs", "sandbox_kwargs")
    @classmethod
    def _kwargs_bounded(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        return bounded_mapping(cfg, "agent_kwargs / sandbox_kwargs")

    @model_validator(mode="after")
    def _one_source(self) -> HarborOptions:
        if self.task_dir and self.dataset:
            raise ValueError("give harbor.task_dir or harbor.dataset (with task_index), not both")
        if self.split and not self.dataset:
            raise ValueError("harbor.split names a subdirectory of harbor.dataset; give the dataset too")
        return self

    @property
    def names_task(self) -> bool:
        return bool(self.task_dir or self.dataset)

    @property
    def calls_model(self) -> bool:
        from harness_env.envs.harbor.config import MODEL_FREE_AGENTS

        return self.agent not in MODEL_FREE_AGENTS

    # -- requests in an earlier form ---------------------------------------------------------------
    @classmethod
    def upgrade_request(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Harbor's options were once sent under `harbor` (before every harness's were
        `harness_options`): read there still, for harness harbor only."""
        if FORMER_KEY not in data:
            return data
        rest = {k: v for k, v in data.items() if k != FORMER_KEY}
        value, harness = data[FORMER_KEY], data.get("harness", DEFAULT_HARNESS)
        if value is None:
            return rest
        if harness != HARNESS_NAME:
            check_text(value, FORMER_KEY)  # say what is wrong with the value first, as for any field
            raise ValueError(f"`{FORMER_KEY}` options are for harness={HARNESS_NAME!r}, not {harness!r}")
        if rest.get(HARNESS_OPTIONS) is not None:
            raise ValueError(f"give {HARNESS_OPTIONS} or its former name `{FORMER_KEY}`, not both")
        return {**rest, HARNESS_OPTIONS: value}

    # -- the command line -------------------------------------------------------------------------
    @classmethod
    def from_command_line(cls, name: str, flags: dict[str, Any], shared: dict[str, tuple[str, ...]]) -> dict[str, Any] | None:
        """A Harbor task or dataset directory given as --task, or any Harbor flag, means harness
        harbor; another --harness given with them is one clear error. --sandbox names a Harbor
        environment unless it is one of the shared flag's own values (auto, bwrap, plain)."""
        task = flags["task"]
        source = _task_source(task, flags.get("task_index"), flags.get("split"))
        sandbox, native = flags.get("sandbox"), shared.get("sandbox", ())
        own = {k: flags[k] for k in ("agent", "reward_key", "agent_kwargs", "sandbox_kwargs") if flags.get(k) is not None}
        if sandbox is not None and sandbox not in native:
            own["sandbox"] = sandbox
        harness = flags.get("harness")
        if source is None and not own and harness != name:
            return None
        if harness not in (None, name):
            if source is not None:
                why = f"--task {task} is a Harbor {'task' if 'task_dir' in source else 'dataset'} directory: it runs with"
            elif list(own) == ["sandbox"]:
                raise ValueError(
                    f"--sandbox {sandbox}: with --harness {harness} choose {', '.join(native[:-1])} or {native[-1]} "
                    f"(Harbor environments such as local, docker or e2b are for --harness {name})"
                )
            else:
                names = [f"--{k.replace('_', '-')}" + (f" {sandbox}" if k == "sandbox" else "") for k in own]
                verb = "is a Harbor option: it is" if len(names) == 1 else "are Harbor options: they are"
                why = f"{' and '.join(names)} {verb} for"
            pinned = ("pi", "opencode")  # agents the local sandbox runs from `harness-env install`
            hint = f" (to run {harness} inside Harbor, use --agent {harness})" if harness in pinned and "agent" not in own else ""
            raise ValueError(f"{why} --harness {name}, not --harness {harness}{hint}")
        if sandbox == "plain":
            raise ValueError(
                f"--sandbox plain: harness {name}'s local environment always runs in bubblewrap; "
                "give a Harbor environment instead (local, docker, e2b, daytona, modal, ...)"
            )
        return {**(source or {}), **own}

    @classmethod
    def cli_commands(cls) -> dict[str, tuple[str, Any, Any]]:
        return {"harbor-tasks": ("list the tasks of a Harbor dataset directory (index, name, instruction)", _tasks_arguments, _tasks_command)}

    # -- the web form -----------------------------------------------------------------------------
    @classmethod
    def choices(cls) -> dict[str, list[tuple[str, str]]]:
        """Harbor's agents (the local sandbox's first) and sandboxes; without the optional harbor
        extra, the local ones (a run then says how to install Harbor)."""
        from harness_env.envs.harbor import config

        try:
            agents, sandboxes = config.harbor_agent_names(), config.harbor_sandbox_names()
        except ImportError:
            agents, sandboxes = sorted(config.LOCAL_AGENTS), [LOCAL_SANDBOX]
        return {"agent": agent_choices(agents), "sandbox": [(n, n) for n in sandbox_choices(sandboxes)]}


class HarborRunInfo(HarnessRunInfo):
    """What Harbor ran, in a harness="harbor" result (its `run_info`)."""

    task_name: str = ""
    task_path: str = ""
    agent: str = ""
    agent_version: str | None = None
    sandbox: str = ""
    exception: str | None = None  # Harbor's own "Type: message", when its trial failed
    verifier_rewards: dict[str, float] | None = None  # reward.json's whole map, when it was one

    def facts(self) -> list[tuple[str, str | dict[str, float] | None]]:
        """What the web page shows of it (core/harness.py RunFact): task, agent, sandbox, Harbor's
        exception, the verifier's reward map."""
        task = self.task_name or "-"
        if self.task_path:
            task += f" ({self.task_path})"
        agent = f"{self.agent or '-'} {self.agent_version}" if self.agent_version else (self.agent or "-")
        return [("task", task), ("agent", agent), ("sandbox", self.sandbox or "-"), ("exception", self.exception), ("verifier rewards", self.verifier_rewards)]


def agent_choices(names: list[str]) -> list[tuple[str, str]]:
    """(label, value) pairs: the agents the local sandbox runs first (the default one at the top),
    then Harbor's others, labelled as needing a provider sandbox (they install themselves)."""
    from harness_env.envs.harbor.config import LOCAL_AGENTS, MODEL_FREE_AGENTS

    local = sorted((n for n in names if n in LOCAL_AGENTS), key=lambda n: (n != DEFAULT_AGENT, n in MODEL_FREE_AGENTS, n))
    others = sorted(n for n in names if n not in LOCAL_AGENTS)
    return [(n, n) for n in local] + [(f"{n} (provider sandbox)", n) for n in others]


def sandbox_choices(names: list[str]) -> list[str]:
    """The local sandbox first, then Harbor's providers in the order given."""
    return [LOCAL_SANDBOX] + [n for n in names if n != LOCAL_SANDBOX]


# -- `harness-env run --task DIR` and `harness-env harbor-tasks` ------------------------------------
def _subdirs(path: Path) -> list[Path]:
    try:
        return [d for d in path.iterdir() if d.is_dir()]
    except OSError:  # unreadable: Harbor's own listing reports it
        return []


def _holds_task_dirs(path: Path) -> bool:
    return any((d / "task.toml").is_file() for d in _subdirs(path))


def _task_source(task: str, task_index: int | None, split: str | None) -> dict[str, Any] | None:
    """The Harbor task --task names (task_dir, or dataset + task_index + split), or None when it is
    a task JSON file."""
    path = Path(task).expanduser()
    picks = task_index is not None or split is not None
    if not path.is_dir():
        if picks:
            raise ValueError(f"--task-index and --split pick a task of a Harbor dataset directory; --task {task} is not a directory")
        return None
    if (path / "task.toml").is_file():
        if picks:
            raise ValueError(f"--task {task} is one Harbor task directory (it has task.toml); --task-index and --split are for a dataset directory of them")
        return {"task_dir": str(path.resolve())}
    tasks_here = _holds_task_dirs(path)
    if not tasks_here and not any(_holds_task_dirs(d) for d in _subdirs(path)):
        raise ValueError(
            f"--task {task} is a directory but neither a Harbor task directory (no task.toml) "
            "nor a Harbor dataset (no task directories in it or in its split subdirectories)"
        )
    if task_index is None:
        hint = "" if tasks_here or split else " --split NAME"
        raise ValueError(
            f"--task {task} is a Harbor dataset directory: pick one of its tasks with{hint} --task-index N "
            f"(list them with: harness-env harbor-tasks {task}{hint})"
        )
    source: dict[str, Any] = {"dataset": str(path.resolve()), "task_index": task_index}
    if split is not None:
        source["split"] = split
    return source


INSTRUCTION_COLUMN_CHARS = 80


def _first_line(text: str, limit: int = INSTRUCTION_COLUMN_CHARS) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _tasks_arguments(parser: Any) -> None:
    parser.add_argument("dataset", metavar="DATASET_DIR", help="a directory of Harbor task directories")
    parser.add_argument("--split", help="the subdirectory of DATASET_DIR holding the tasks")
    parser.add_argument("--json", action="store_true", help="print the list as JSON (DatasetTaskInfo objects)")


def _tasks_command(args: Any) -> int:
    """`harness-env harbor-tasks DIR`: a table (or JSON) of what task_index counts. Bad input
    raises (ValueError, HarnessEnvError): the CLI prints it in one line."""
    from harness_env.envs.harbor.resolve import list_tasks

    path = Path(args.dataset).expanduser()
    if (path / "task.toml").is_file():
        raise ValueError(
            f"{args.dataset} is one Harbor task directory (it has task.toml), not a dataset of them; run it with: harness-env run --task {args.dataset} ..."
        )
    tasks = list_tasks(str(path), args.split, trusted=True)
    if args.json:
        print(json.dumps([t.model_dump(mode="json") for t in tasks], indent=2))
        return 0
    if not tasks:
        print(f"harness-env: no Harbor task directories in {args.dataset}{f' (split {args.split})' if args.split else ''}", file=sys.stderr)
        return 0
    rows = [(str(t.index), t.name, _first_line(t.instruction)) for t in tasks]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(("INDEX", "NAME"))]
    print(f"{'INDEX':>{widths[0]}}  {'NAME':<{widths[1]}}  INSTRUCTION")
    for index, name, instruction in rows:
        print(f"{index:>{widths[0]}}  {name:<{widths[1]}}  {instruction}".rstrip())
    return 0
