"""A Harbor environment backed by our local sandbox (bubblewrap), for running Harbor trials
without Docker.

Harbor addresses fixed absolute paths inside its environment (/logs/agent, /logs/verifier, /tests,
/solution, the task's workdir, ...); each is a directory inside the rollout directory, bound at its
absolute path by bubblewrap (the table is env_paths.py's).

Without bubblewrap those paths cannot be mapped (rewriting every command is unsound), so this
environment refuses to start without it, with a message saying how to install it.

/tmp is <rollout>/tmp (the sandbox's TMPDIR too), so it persists between exec calls as it would in
a container (Harbor's agents keep their config there, e.g. /tmp/harbor-pi-agent).

The task's `docker_image` is the sandbox's root (pulled with skopeo, core/sandbox/images.py), the
pinned CLIs mounted read-only from the host's tools directory; without one, its Dockerfile is built
with buildah when the operator allows it (core/sandbox/build.py), else ignored (commands run on the
host's system, read-only, and a note says how to change that). A task
directory written by envs/harbor/task_dir.task_to_task_dir carries environment/files (copied into
the workdir) and environment/setup.sh (run from the workdir at start); for other tasks the
Dockerfile is ignored and a note is logged. `user` is ignored
(everything runs as the calling user); resource limits are the sandbox's own. Harbor reads the
verifier and agent directories through download_dir (capabilities.mounted stays False: the host
copies are Harbor's own trial dirs, ours live in the rollout directory).

Everything in the rollout directory is the agent's to plant links, FIFOs, huge files and deep
trees in, so every transfer goes through core/sandbox/safefs from the rollout directory, in a
thread (env_transfers.py says how). Before each command the directories bubblewrap binds are
checked to be real directories (bwrap follows links in bind sources); when the verifier starts,
/tests and /logs/verifier are made afresh and commands get the sandbox's verify environment (a
fresh HOME, the system PATH: nothing the agent left in its home runs in the verifier).
"""

from __future__ import annotations

import asyncio
import functools
import os
import shlex
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import TaskOS
from harbor.utils.path_filter import filter_paths_by_patterns

from harness_env.core import toolchain
from harness_env.core.errors import SandboxError, ToolMissingError
from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.build import BUILD_TIMEOUT_S, BUILD_VAR, build_image, builds_allowed
from harness_env.core.sandbox.envvars import SYSTEM_PATH
from harness_env.core.sandbox.local import LocalSandbox, bwrap_available, create_local_sandbox
from harness_env.core.sandbox.threads import in_thread
from harness_env.envs.harbor.env_paths import ENV_TYPE, VERIFIER_REL, check_workdir, container_binds
from harness_env.envs.harbor.env_paths import rel_path as map_rel_path
from harness_env.envs.harbor.env_transfers import Select, copy_dir_out, exclusion_select, left_out_note
from harness_env.envs.harbor.env_transfers import tar_excluded as _tar_excluded  # noqa: F401  (tests import it from here)
from harness_env.envs.harbor.task_dir import DEFAULT_WORKDIR, FILES_DIRNAME, SETUP_SCRIPT, is_converted

DEFAULT_EXEC_TIMEOUT_S = 3600.0
SETUP_TIMEOUT_S = 600.0
# What one download may copy into Harbor's trial directory (Harbor reads those files whole, on its
# event loop): a larger file is left out, never cut, and noted.
DOWNLOAD_MAX_FILE_BYTES = 32 * 1024 * 1024
DOWNLOAD_MAX_TOTAL_BYTES = 128 * 1024 * 1024
DOWNLOAD_MAX_FILES = 10_000
DOWNLOAD_MAX_DEPTH = 32
MAX_TRANSFER_NOTES = 20

NO_BWRAP_MESSAGE = (
    "the harness-env-local Harbor environment needs bubblewrap (Harbor's fixed paths /logs, /tests, "
    "/solution and the workdir are bound into the sandbox; plain processes cannot see them): "
    "install it with `apt-get install bubblewrap`"
)


class LocalHarborEnvironment(BaseEnvironment):
    """Harbor environment on a LocalSandbox. Created by Harbor from
    `EnvironmentConfig(import_path="harness_env.envs.harbor.local_env:LocalHarborEnvironment")`."""

    _sandbox: LocalSandbox | None = None
    _verifying = False  # set when Harbor's verifier starts: commands then get the verify environment
    # The workspace's files as they stood when the environment stopped (the sandbox is gone then).
    collected_files: dict[str, str] | None = None
    sandbox_id: str | None = None
    _built: str | None = None  # the image the task's Dockerfile built (core/sandbox/build.py), if it did

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.transfer_notes: list[str] = []  # what downloads left out (links, FIFOs, oversized files)

    @staticmethod
    def type() -> str:
        return ENV_TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities()

    @property
    def workdir(self) -> str:
        return str(PurePosixPath(self.task_env_config.workdir or DEFAULT_WORKDIR))

    def _validate_definition(self) -> None:
        if self.task_env_config.os != TaskOS.LINUX:
            raise ValueError(f"{ENV_TYPE} runs Linux tasks only, not {self.task_env_config.os.value!r}")
        check_workdir(self.workdir)
        if not bwrap_available():
            raise SandboxError(NO_BWRAP_MESSAGE)

    # -- path mapping -------------------------------------------------------------------
    def _binds(self) -> dict[str, str]:
        return container_binds(self.workdir)

    def rel_path(self, path: str | PurePosixPath) -> str:
        """An environment path as a path relative to the rollout directory, by name only (see
        env_paths.rel_path); SandboxError for one outside the mapped directories or with '..'."""
        return map_rel_path(path, self.workdir, str(self._require().root))

    def host_path(self, path: str | PurePosixPath) -> Path:
        """The host path of an environment path (see rel_path), checked to stay inside the rollout
        directory after links are followed. A name for a working directory: never open it with
        open(), read it through safefs from the rollout directory and rel_path."""
        sb = self._require()
        return sb.resolve(str(sb.root / self.rel_path(path)))

    def _require(self) -> LocalSandbox:
        if self._sandbox is None:
            raise SandboxError(f"{ENV_TYPE} environment {self.session_id} is not started")
        return self._sandbox

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self, force_build: bool) -> None:
        if self._sandbox is not None:
            return
        image = self.task_env_config.docker_image or await self._built_image()
        # A pull (or a build) takes minutes and blocks: on the sandbox threads, never the event loop
        # the trial and the capture proxy run on (core/sandbox/threads.py).
        make = functools.partial(
            create_local_sandbox, use_bwrap=True, extra_binds=self._binds(), ro_paths=[str(toolchain.tools_dir())], image=image or None
        )  # the task's image as the root (core/sandbox/images.py)
        self._sandbox = await in_thread(make, lambda late: late.close())
        self.sandbox_id = self._sandbox.sandbox_id
        try:
            await asyncio.to_thread(self._make_dirs_and_wrappers)
            await self._prepare_workdir()
        except BaseException:
            await self.stop(delete=True)
            raise

    async def _built_image(self) -> str | None:
        """The image the task's Dockerfile builds, when the operator allows builds (core/sandbox/build.py)
        and the task is not one of ours (a converted task's files and setup.sh are applied instead)."""
        env_dir = Path(self.environment_dir)
        if not (env_dir / "Dockerfile").is_file() or is_converted(env_dir) or not builds_allowed():
            return None
        build = functools.partial(build_image, env_dir, self.task_env_config.build_timeout_sec or BUILD_TIMEOUT_S)
        self._built = await in_thread(build, lambda ref: None)  # the layout stays in the cache for the next
        return self._built

    def _make_dirs_and_wrappers(self) -> None:
        for sub in ("agent", "artifacts"):
            (self._require().root / "harbor" / "logs" / sub).mkdir(parents=True, exist_ok=True)
        self._link_toolchain()

    @property
    def _bin_dir(self) -> Path:
        return Path(self._require().home) / ".local" / "bin"

    def _link_toolchain(self) -> None:
        """Put the pinned CLIs (`harness-env install`) on the sandbox's PATH as small wrappers, and
        give Harbor's agents the `~/.nvm/nvm.sh` they source (empty: Node is ours)."""
        home = Path(self._require().home)
        self._bin_dir.mkdir(parents=True, exist_ok=True)
        for name, pin in toolchain.pins().items():
            try:
                argv = toolchain.harness_command(name)
            except ToolMissingError:
                continue  # an agent that needs it says so at install
            wrapper = self._bin_dir / pin.bin  # the command Harbor's agent runs (claude, gemini, ...)
            wrapper.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in argv) + ' "$@"\n')
            wrapper.chmod(0o755)
        (home / ".nvm").mkdir(exist_ok=True)
        (home / ".nvm" / "nvm.sh").write_text("# harness-env: Node and the agent CLIs are preinstalled on PATH\n")

    async def _prepare_workdir(self) -> None:
        env_dir = Path(self.environment_dir)
        if self._built is not None:
            return  # the Dockerfile's own steps made the environment
        files, setup = env_dir / FILES_DIRNAME, env_dir / SETUP_SCRIPT
        if files.is_dir():
            await asyncio.to_thread(safefs.copy_in, files, self._require().root, "workspace")  # links stay links
        if setup.is_file():
            sb = self._require()
            script = sb.root / "tmp" / ".harness-env-setup.sh"
            await asyncio.to_thread(safefs.copy_in, setup, sb.root, f"tmp/{script.name}")
            result = await sb.exec(
                ["bash", str(script)], timeout=self.task_env_config.build_timeout_sec or SETUP_TIMEOUT_S, env=self._persistent_env, cwd=sb.workspace
            )
            await asyncio.to_thread(self._remove_in_rollout, "tmp", script.name)  # no link followed
            if result.exit_code != 0:
                what = "timed out" if result.timed_out else f"failed with exit code {result.exit_code}"
                raise RuntimeError(f"environment/setup.sh {what}: {(result.stderr or result.stdout)[-2000:]}")
        elif (env_dir / "Dockerfile").is_file() and not self.task_env_config.docker_image and not builds_allowed():
            self.logger.warning(
                f"{ENV_TYPE}: the task's Dockerfile is not built; commands run on the host's system (read-only) in a "
                f"bubblewrap sandbox. Allow builds with {BUILD_VAR}=1 (buildah), or build and push it and name it in "
                "task.toml's [environment] docker_image"
            )

    def _remove_in_rollout(self, parent: str, name: str) -> None:
        try:
            pfd = safefs.open_dir(self._require().root, parent)
        except OSError:
            return
        try:
            safefs.remove_tree(f"/proc/self/fd/{pfd}/{name}")
        finally:
            os.close(pfd)

    async def stop(self, delete: bool) -> None:
        # The rollout directory only holds copies (Harbor downloads what it keeps), so it is
        # always removed; `delete` has nothing more to remove.
        sb, self._sandbox = self._sandbox, None
        if sb is not None:
            try:
                self.collected_files = await asyncio.to_thread(sb.collect_files)
            except Exception as e:  # best effort: closing must still happen
                self.logger.warning(f"{ENV_TYPE}: collecting the workspace's files failed: {e}")
            await sb.close()

    # -- commands -----------------------------------------------------------------------
    def _container_env(self) -> dict[str, str]:
        """What a container's shell would have: the CLIs on PATH, and the XDG directories under
        HOME (the sandbox's own XDG_* point elsewhere; Harbor's agents write ~/.config/...). Once
        verification started: the sandbox's verify environment instead (a fresh HOME and config
        dirs, git/Python/npm user config ignored) and the system PATH only, so nothing the agent
        wrote in its home (wrappers on PATH, .gitconfig, .pth files) runs in the verifier."""
        sb = self._require()
        if self._verifying:
            return {"PATH": SYSTEM_PATH, **sb.verify_env()}
        home = sb.home
        return {
            "PATH": f"{self._bin_dir}:{SYSTEM_PATH}",
            "XDG_CONFIG_HOME": f"{home}/.config",
            "XDG_CACHE_HOME": f"{home}/.cache",
            "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_STATE_HOME": f"{home}/.local/state",
        }

    async def exec(
        self, command: str, cwd: str | None = None, env: dict[str, str] | None = None, timeout_sec: int | None = None, user: str | int | None = None
    ) -> ExecResult:
        sb = self._require()
        self._check_binds()
        merged = {**self._container_env(), **(self._merge_env(env) or {})}
        host_cwd = self.host_path(cwd) if cwd else Path(sb.workspace)
        result = await sb.exec(command, timeout=float(timeout_sec) if timeout_sec else DEFAULT_EXEC_TIMEOUT_S, env=merged, cwd=str(host_cwd))
        stderr = result.stderr
        if result.timed_out:
            stderr += f"\n[{ENV_TYPE}: command timed out after {timeout_sec}s and was killed]"
            code = 124
        else:
            code = result.exit_code if result.exit_code is not None else 137
        return ExecResult(stdout=result.stdout, stderr=stderr, return_code=code)

    # -- files (env_transfers.py: never trusting what the agent left) -------------------
    def _note_transfer(self, what: str, report: safefs.CopyReport) -> None:
        note = left_out_note(what, report, ENV_TYPE)
        if note:
            self.logger.warning(note)
            if len(self.transfer_notes) < MAX_TRANSFER_NOTES:
                self.transfer_notes.append(note[:2000])

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        root, rel = self._require().root, self.rel_path(target_path)
        await asyncio.to_thread(safefs.copy_in, Path(source_path), root, rel)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        root, rel = self._require().root, self.rel_path(target_dir)
        if not rel or rel == ".":
            raise SandboxError(f"{ENV_TYPE}: refusing to upload over the rollout directory itself")
        await asyncio.to_thread(safefs.copy_in, Path(source_dir), root, rel)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        root, rel = self._require().root, self.rel_path(source_path)
        await asyncio.to_thread(safefs.copy_file_out, root, rel, Path(target_path), max_bytes=DOWNLOAD_MAX_FILE_BYTES)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self._download(source_dir, Path(target_dir), None)

    async def download_dir_filtered(
        self,
        *,
        source_dir: str,
        target_dir: Path | str,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        protect: Sequence[str] | None = None,
    ) -> None:
        """Harbor's filtered download (fnmatch on paths relative to the source, exclude wins,
        `protect` always kept), done from the host: Harbor's own runs find and tar in the sandbox
        and copies an archive of any size out through /tmp."""
        protected = set(protect or ())

        def select(path: str, is_dir: bool) -> bool:
            if is_dir or path in protected:
                return True
            return bool(filter_paths_by_patterns([path], include=include, exclude=exclude))

        await self._download(source_dir, Path(target_dir), select)

    async def download_dir_with_exclusions(self, *, source_dir: str, target_dir: Path | str, exclude: list[str]) -> None:
        """Harbor's download with tar-style excludes (a pattern matches any run of whole path
        components, so an excluded directory goes with its contents), done from the host."""
        await self._download(source_dir, Path(target_dir), exclusion_select(exclude))

    async def _download(self, source_dir: str, target: Path, select: Select | None) -> None:
        root, rel = self._require().root, self.rel_path(source_dir)

        report = await asyncio.to_thread(
            copy_dir_out,
            root,
            rel,
            target,
            select,
            max_file_bytes=DOWNLOAD_MAX_FILE_BYTES,
            max_total_bytes=DOWNLOAD_MAX_TOTAL_BYTES,
            max_files=DOWNLOAD_MAX_FILES,
            max_depth=DOWNLOAD_MAX_DEPTH,
        )
        if report is not None:
            self._note_transfer(source_dir, report)

    def _check_binds(self) -> None:
        """Every directory bubblewrap binds from the rollout directory (Harbor's /logs, /tests,
        ..., the workdir, the verifier directory) is a real directory reached without a link:
        bwrap opens its bind sources following links, so a bind source the agent replaced by a
        link would mount whatever it names (a host directory, writable) into the next command."""
        sb = self._require()
        for rel in (VERIFIER_REL, *self._binds().values()):
            try:
                os.close(safefs.open_dir(sb.root, rel))
            except OSError as e:
                raise SandboxError(
                    f"{ENV_TYPE}: {rel} in the rollout directory is no longer a directory ({e.strerror or e}); "
                    "something in the sandbox replaced it, so no further command runs"
                ) from None

    def reset_for_verification(self) -> None:
        """Fresh /tests and /logs/verifier before Harbor's verifier runs, made from the host side:
        whatever the agent put there (links, FIFOs, a directory named reward.txt, the directory
        itself replaced by a link) cannot steer or block the verifier; from now on commands run
        with the verify environment. Blocking: run it in a thread."""
        sb = self._require()
        sb.clear_reward_file()  # the verifier directory made afresh, the agent's processes killed
        try:
            os.close(safefs.open_dir(sb.root, VERIFIER_REL))
        except OSError:  # a sandbox that left a link or a file there: replace it here
            self._fresh_dir(VERIFIER_REL)
        self._fresh_dir(self._binds()["/tests"])
        self._verifying = True

    def _fresh_dir(self, rel: str) -> None:
        """Replace rollout/`rel` with an empty directory of the server's, whatever was there; the
        directories above it must be real ones (SandboxError otherwise: verify must not run)."""
        root = self._require().root
        parent, name = os.path.split(rel)
        try:
            pfd = safefs.open_dir(root, parent)
        except OSError as e:
            raise SandboxError(f"{ENV_TYPE}: {parent} in the rollout directory is no longer a directory ({e.strerror or e})") from None
        try:
            problem = safefs.remove_tree(f"/proc/self/fd/{pfd}/{name}")  # our descriptor's directory, then `name`, not followed
            if problem is None:
                os.mkdir(name, 0o755, dir_fd=pfd)
        except OSError as e:
            problem = e.strerror or str(e)
        finally:
            os.close(pfd)
        if problem:
            raise SandboxError(f"{ENV_TYPE}: could not reset {rel} before verify: {problem}")
