"""The white-box tools as a TRL `environment_factory` environment, for trainers that own the loop.

TRL's GRPOTrainer makes one instance per rollout (`environment_factory=WhiteboxEnv`), calls
`reset(**row)` with the dataset row before generating, exposes every public method but `reset` and
`get_reward` as a tool (schema from the type hints and the `Args:` docstring sections), runs the
model's tool calls against them, and calls `get_reward()` when the rollout is complete.

A row holds the task: `instruction`, and optionally `setup`, `verify` (lists of shell commands),
`files` (path -> content), `task_id`. Each instance owns one sandbox at a time (the same local
sandbox as every rollout) and a private event loop thread, so the sync methods TRL calls never
block or need the caller's loop. `close(env)`, a `with` block, or garbage collection removes the
sandbox.
"""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

from harness_env.core.sandbox.local import LocalSandbox, create_local_sandbox
from harness_env.core.task_commands import run_setup, run_verify
from harness_env.envs.whitebox.tools import ToolBox, ToolLimits
from harness_env.models import CommandResult, Task

T = TypeVar("T")


class _LoopThread:
    """An event loop running in a daemon thread, for calling async code from sync methods."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="whitebox-env", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
        if not self.loop.is_running():
            self.loop.close()


def _release(runner: _LoopThread, box: dict[str, LocalSandbox | None]) -> None:
    sandbox = box.get("sandbox")
    if sandbox is not None and runner.loop.is_running():
        runner.run(sandbox.close())
    box["sandbox"] = None
    runner.stop()


class WhiteboxEnv:
    """One rollout's sandbox and the white-box tools, as TRL's `environment_factory` expects."""

    def __init__(
        self,
        *,
        use_bwrap: bool | None = None,
        tool_timeout_s: float = 60.0,
        max_tool_output_bytes: int = 16 * 1024,
        setup_timeout_s: float = 300.0,
        verify_timeout_s: float = 300.0,
    ) -> None:
        self._use_bwrap = use_bwrap
        self._limits = ToolLimits.from_config({"tool_timeout_s": tool_timeout_s, "max_tool_output_bytes": max_tool_output_bytes})
        self._setup_timeout_s = setup_timeout_s
        self._verify_timeout_s = verify_timeout_s
        self._runner = _LoopThread()
        self._box: dict[str, LocalSandbox | None] = {"sandbox": None}
        self._finalizer = weakref.finalize(self, _release, self._runner, self._box)
        self._task: Task | None = None
        self._tools: ToolBox | None = None
        self.tool_calls = 0
        self.answer: str | None = None
        self.setup_results: list[CommandResult] = []
        self.verify_results: list[CommandResult] = []
        self.reward_notes: list[str] = []
        self.error: str | None = None  # why this rollout cannot be graded (reset failed)

    # -- the trainer's side -----------------------------------------------------------------
    def reset(self, **row: Any) -> str:
        """Start a fresh sandbox for the task in `row` and return its instruction. A row that is not
        a valid task raises (a data error to fix before training); a setup that fails does not: the
        rollout then goes unscored (get_reward() is None) and `error` says why."""
        task = Task.model_validate({k: row[k] for k in ("instruction", "setup", "verify", "files", "task_id") if row.get(k) is not None})
        self._runner.run(self._reset(task))
        return task.instruction

    async def _reset(self, task: Task) -> None:
        await self._close_sandbox()
        self._task, self._tools, self.tool_calls, self.answer, self.error = task, None, 0, None, None
        self.setup_results, self.verify_results, self.reward_notes = [], [], []
        try:
            sandbox = await asyncio.to_thread(create_local_sandbox, use_bwrap=self._use_bwrap, ro_paths=[])
            self._box["sandbox"] = sandbox
            for path, content in task.files.items():
                sandbox.write_file(path, content)
            self.error = await run_setup(sandbox, task.setup, self._setup_timeout_s, self.setup_results)
        except Exception as e:  # infrastructure: reported as data, never a crashed training step
            self.error = f"the sandbox could not be prepared: {type(e).__name__}: {e}"
        if self.error is None:
            self._tools = ToolBox(sandbox, self._limits)

    def get_reward(self) -> float | None:
        """The task's reward from its verify commands; None when it cannot be graded (TRL then
        leaves the rollout unscored)."""
        sandbox = self._box["sandbox"]
        if self._task is None or sandbox is None or self.error is not None:
            return None
        self.verify_results = []
        reward, _source, self.reward_notes = self._runner.run(run_verify(sandbox, self._task.verify, self._verify_timeout_s, self.verify_results))
        return reward

    # Closing is not a public method: TRL would offer it to the model as a tool.
    def __enter__(self) -> WhiteboxEnv:
        return self

    def __exit__(self, *_exc: object) -> None:
        close(self)

    async def _close_sandbox(self) -> None:
        sandbox, self._box["sandbox"] = self._box["sandbox"], None
        if sandbox is not None:
            await sandbox.close()

    def _call(self, name: str, **args: Any) -> str:
        if self._tools is None:
            return f"error: {self.error or 'no task is loaded; the trainer must call reset() first'}"
        # The arguments come parsed from TRL; the tool box takes them as the model's JSON.
        reply = self._runner.run(self._tools.call(name, json.dumps(args)))
        if reply.submitted is not None:
            self.answer = reply.submitted
        else:
            self.tool_calls += 1
        return reply.content

    # -- the tools (their docstrings are the schema the model sees) ---------------------------
    def bash(self, command: str) -> str:
        """Run a shell command (bash -c) in the workspace and return its output and exit code.

        Args:
            command: The command line to run.
        """
        return self._call("bash", command=command)

    def read(self, path: str, offset: int = 1, limit: int = 2000) -> str:
        """Read a text file, with line numbers.

        Args:
            path: The file to read.
            offset: The first line to return (1-based).
            limit: How many lines to return at most.
        """
        return self._call("read", path=path, offset=offset, limit=limit)

    def write(self, path: str, content: str) -> str:
        """Create or overwrite a file with the given content (parent directories are created).

        Args:
            path: The file to write.
            content: The whole new content of the file.
        """
        return self._call("write", path=path, content=content)

    def edit(self, path: str, old_string: str, new_string: str, replace_all: bool = False) -> str:
        """Replace an exact piece of text in a file. old_string must occur exactly once unless replace_all is true.

        Args:
            path: The file to edit.
            old_string: The exact text to replace.
            new_string: The text to put in its place.
            replace_all: Replace every occurrence instead of exactly one.
        """
        return self._call("edit", path=path, old_string=old_string, new_string=new_string, replace_all=replace_all)

    def ls(self, path: str = ".") -> str:
        """List a directory (directories end in /).

        Args:
            path: The directory to list.
        """
        return self._call("ls", path=path)

    def grep(self, pattern: str, path: str = ".", include: str = "") -> str:
        """Search file contents for a regular expression (extended syntax); returns file:line:text matches.

        Args:
            pattern: The regular expression to search for.
            path: The file or directory to search.
            include: Only search files whose name matches this glob, e.g. *.py.
        """
        return self._call("grep", pattern=pattern, path=path, include=include)

    def glob(self, pattern: str) -> str:
        """List the files whose paths match a glob pattern, e.g. **/*.py.

        Args:
            pattern: The glob pattern, relative to the workspace.
        """
        return self._call("glob", pattern=pattern)

    def submit(self, answer: str) -> str:
        """Finish the task and hand in the answer. Call it once, when the work is done.

        Args:
            answer: A short summary of what was done, or the answer the task asks for.
        """
        return self._call("submit", answer=answer)


def close(env: WhiteboxEnv) -> None:
    """Remove the environment's sandbox and stop its private loop; it is unusable afterwards."""
    env._finalizer()
