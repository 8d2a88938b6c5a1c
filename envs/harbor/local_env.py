"""A Harbor environment backed by our local sandbox (bubblewrap), for running Harbor trials
without Docker.

Harbor addresses fixed absolute paths inside its environment (harbor/models/trial/paths.py,
EnvironmentPaths): /logs/agent, /logs/verifier, /logs/artifacts, /tests, /solution, plus the
task's workdir. Here each is a directory inside the rollout directory, bound at its absolute
path by bubblewrap:

    /logs            <rollout>/harbor/logs   (agent/, artifacts/ inside)
    /logs/verifier   <rollout>/verifier      (the sandbox's own verifier dir, as for our verify)
    /tests           <rollout>/harbor/tests
    /solution        <rollout>/harbor/solution
    <workdir>        <rollout>/workspace     (task.toml [environment].workdir, default /app)
    /tmp             <rollout>/tmp
    /installed-agent <rollout>/harbor/installed-agent

Without bubblewrap those paths cannot be mapped (rewriting every command is unsound), so this
environment refuses to start without it, with a message saying how to install it.

/tmp is <rollout>/tmp (the sandbox's TMPDIR too), so it persists between exec calls as it would in
a container (Harbor's agents keep their config there, e.g. /tmp/harbor-pi-agent).

What is not honoured: the task's Dockerfile / docker_image (commands run on the host's system,
read-only). A task directory written by envs/harbor/task_dir.task_to_task_dir carries
environment/files (copied into the workdir) and environment/setup.sh (run from the workdir at
start); for other tasks the Dockerfile is ignored and a note is logged. `user` is ignored
(everything runs as the calling user); resource limits are the sandbox's own. Harbor reads the
verifier and agent directories through download_dir (capabilities.mounted stays False: the host
copies are Harbor's own trial dirs, ours live in the rollout directory).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
from pathlib import Path, PurePosixPath

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import TaskOS

from harness_env.core import toolchain
from harness_env.core.errors import SandboxError, ToolMissingError
from harness_env.core.sandbox.envvars import SYSTEM_PATH
from harness_env.core.sandbox.local import LocalSandbox, bwrap_available, create_local_sandbox
from harness_env.envs.harbor.task_dir import DEFAULT_WORKDIR, FILES_DIRNAME, SETUP_SCRIPT

ENV_TYPE = "harness-env-local"
DEFAULT_EXEC_TIMEOUT_S = 3600.0
SETUP_TIMEOUT_S = 600.0
# Top-level directories a workdir may not live under: bwrap can't create a mount point inside the
# host's read-only system directories, and the others are the sandbox's own mounts.
_FORBIDDEN_WORKDIR_TOPS = frozenset({"", "usr", "bin", "sbin", "lib", "lib64", "etc", "var", "opt", "proc", "dev", "sys",
                                     "tmp", "logs", "tests", "solution", "root", "home", "run", "boot"})

NO_BWRAP_MESSAGE = (
    "the harness-env-local Harbor environment needs bubblewrap (Harbor's fixed paths /logs, /tests, "
    "/solution and the workdir are bound into the sandbox; plain processes cannot see them): "
    "install it with `apt-get install bubblewrap`"
)


class LocalHarborEnvironment(BaseEnvironment):
    """Harbor environment on a LocalSandbox. Created by Harbor from
    `EnvironmentConfig(import_path="harness_env.envs.harbor.local_env:LocalHarborEnvironment")`."""

    _sandbox: LocalSandbox | None = None
    # The workspace's files as they stood when the environment stopped (the sandbox is gone then).
    collected_files: dict[str, str] | None = None
    sandbox_id: str | None = None

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
        wd = PurePosixPath(self.workdir)
        if not wd.is_absolute() or ".." in wd.parts or wd.parts[1:2] == () or wd.parts[1] in _FORBIDDEN_WORKDIR_TOPS:
            raise ValueError(
                f"{ENV_TYPE} cannot map workdir {self.workdir!r}: it must be an absolute path under a "
                f"top-level directory other than {sorted(t for t in _FORBIDDEN_WORKDIR_TOPS if t)}"
            )
        if not bwrap_available():
            raise SandboxError(NO_BWRAP_MESSAGE)

    # -- path mapping -------------------------------------------------------------------
    def _binds(self) -> dict[str, str]:
        """Harbor's fixed container paths -> subdirectories of the rollout directory (bwrap binds
        them; host_path maps them). /logs/verifier is the sandbox's own verifier directory."""
        return {
            "/logs": "harbor/logs",
            "/tests": "harbor/tests",
            "/solution": "harbor/solution",
            "/installed-agent": "harbor/installed-agent",  # Harbor's agent setup makes it
            "/tmp": "tmp",
            self.workdir: "workspace",
        }

    def _mapping(self) -> list[tuple[PurePosixPath, Path]]:
        sb = self._require()
        pairs = [(PurePosixPath("/logs/verifier"), Path(sb.verifier_dir))]
        pairs += [(PurePosixPath(inside), sb.root / rel) for inside, rel in self._binds().items()]
        return sorted(pairs, key=lambda p: len(p[0].parts), reverse=True)

    def host_path(self, path: str | PurePosixPath) -> Path:
        """The host path of an environment path: one of the mapped directories (relative paths
        are relative to the workdir), or an absolute path already inside the rollout directory."""
        sb = self._require()
        p = PurePosixPath(path)
        if not p.is_absolute():
            p = PurePosixPath(self.workdir) / p
        if p.is_relative_to(PurePosixPath(str(sb.root))):  # bound at its own path (may be under /tmp)
            return sb.resolve(str(p))
        for inside, host in self._mapping():
            if p == inside or p.is_relative_to(inside):
                return sb.resolve(str(host.joinpath(*p.relative_to(inside).parts)))
        return sb.resolve(str(p))  # raises SandboxError outside the rollout directory

    def _require(self) -> LocalSandbox:
        if self._sandbox is None:
            raise SandboxError(f"{ENV_TYPE} environment {self.session_id} is not started")
        return self._sandbox

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self, force_build: bool) -> None:
        if self._sandbox is not None:
            return
        self._sandbox = create_local_sandbox(
            use_bwrap=True,
            extra_binds=self._binds(),
            ro_paths=[str(toolchain.tools_dir())],
        )
        self.sandbox_id = self._sandbox.sandbox_id
        try:
            for sub in ("agent", "artifacts"):
                (self._sandbox.root / "harbor" / "logs" / sub).mkdir(parents=True, exist_ok=True)
            self._link_toolchain()
            await self._prepare_workdir()
        except BaseException:
            await self.stop(delete=True)
            raise

    @property
    def _bin_dir(self) -> Path:
        return Path(self._require().home) / ".local" / "bin"

    def _link_toolchain(self) -> None:
        """Put the pinned CLIs (`harness-env install`) on the sandbox's PATH as small wrappers, and
        give Harbor's agents the `~/.nvm/nvm.sh` they source (empty: Node is ours)."""
        home = Path(self._require().home)
        self._bin_dir.mkdir(parents=True, exist_ok=True)
        for name in toolchain.PINS:
            try:
                argv = toolchain.harness_command(name)
            except ToolMissingError:
                continue  # an agent that needs it says so at install
            wrapper = self._bin_dir / name
            wrapper.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in argv) + ' "$@"\n')
            wrapper.chmod(0o755)
        (home / ".nvm").mkdir(exist_ok=True)
        (home / ".nvm" / "nvm.sh").write_text("# harness-env: Node and the agent CLIs are preinstalled on PATH\n")

    async def _prepare_workdir(self) -> None:
        env_dir = Path(self.environment_dir)
        files, setup = env_dir / FILES_DIRNAME, env_dir / SETUP_SCRIPT
        if files.is_dir():
            await asyncio.to_thread(shutil.copytree, files, self._require().workspace, dirs_exist_ok=True, symlinks=True)
        if setup.is_file():
            sb = self._require()
            script = sb.root / "tmp" / ".harness-env-setup.sh"
            await asyncio.to_thread(shutil.copyfile, setup, script)
            result = await sb.exec(
                ["bash", str(script)], timeout=self.task_env_config.build_timeout_sec or SETUP_TIMEOUT_S,
                env=self._persistent_env, cwd=sb.workspace
            )
            script.unlink(missing_ok=True)
            if result.exit_code != 0:
                what = "timed out" if result.timed_out else f"failed with exit code {result.exit_code}"
                raise RuntimeError(f"environment/setup.sh {what}: {(result.stderr or result.stdout)[-2000:]}")
        elif (env_dir / "Dockerfile").is_file() or self.task_env_config.docker_image:
            self.logger.warning(
                f"{ENV_TYPE}: the task's Dockerfile/docker_image is ignored; commands run on the host's "
                "system (read-only) in a bubblewrap sandbox"
            )

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
        HOME (the sandbox's own XDG_* point elsewhere; Harbor's agents write ~/.config/...)."""
        home = self._require().home
        return {
            "PATH": f"{self._bin_dir}:{SYSTEM_PATH}",
            "XDG_CONFIG_HOME": f"{home}/.config",
            "XDG_CACHE_HOME": f"{home}/.cache",
            "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_STATE_HOME": f"{home}/.local/state",
        }

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        sb = self._require()
        merged = {**self._container_env(), **(self._merge_env(env) or {})}
        host_cwd = self.host_path(cwd) if cwd else Path(sb.workspace)
        result = await sb.exec(
            command,
            timeout=float(timeout_sec) if timeout_sec else DEFAULT_EXEC_TIMEOUT_S,
            env=merged,
            cwd=str(host_cwd),
        )
        stderr = result.stderr
        if result.timed_out:
            stderr += f"\n[{ENV_TYPE}: command timed out after {timeout_sec}s and was killed]"
            code = 124
        else:
            code = result.exit_code if result.exit_code is not None else 137
        return ExecResult(stdout=result.stdout, stderr=stderr, return_code=code)

    # -- files --------------------------------------------------------------------------
    # What the agent left in the sandbox is never trusted: a symlink it planted must neither let an
    # upload write outside the rollout directory (e.g. /tests/test.sh -> a host file) nor let a
    # download hand a host file to the server's readers (e.g. /logs/agent/x.txt -> /proc/self/environ).
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        target = self.host_path(target_path)
        await asyncio.to_thread(_copy_in, Path(source_path), target, self._require().root)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        target = self.host_path(target_dir)
        root = self._require().root

        def copy() -> None:
            src = Path(source_dir)
            for entry in sorted(src.rglob("*")):
                if entry.is_file() or entry.is_symlink():
                    _copy_in(entry, target / entry.relative_to(src), root)
                elif entry.is_dir():
                    _make_dir_in(target / entry.relative_to(src), root)

        await asyncio.to_thread(copy)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        source = self.host_path(source_path)  # resolved: a link out of the rollout is refused there
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(shutil.copy2, source, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        source = self.host_path(source_dir)
        await asyncio.to_thread(_copy_out, source, Path(target_dir))

    def reset_for_verification(self) -> None:
        """Fresh /tests and /logs/verifier before Harbor's verifier runs, made from the host side:
        whatever the agent put there (links, a directory named reward.txt) cannot steer or block
        the verifier."""
        sb = self._require()
        sb.clear_reward_file()  # the whole verifier directory, made afresh
        tests = sb.root / self._binds()["/tests"]  # not resolved: whatever is there is replaced
        shutil.rmtree(tests, ignore_errors=True)
        tests.mkdir(parents=True, exist_ok=True)


def _make_dir_in(path: Path, root: Path) -> None:
    if not path.resolve().is_relative_to(root.resolve()):  # checked before mkdir follows a link
        raise SandboxError(f"refusing to write through a link out of the rollout directory: {path}")
    path.mkdir(parents=True, exist_ok=True)


def _copy_in(source: Path, target: Path, root: Path) -> None:
    """Copy one file into the sandbox; a link planted at the target is replaced, not followed."""
    _make_dir_in(target.parent, root)
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        shutil.rmtree(target)
    shutil.copy2(source, target, follow_symlinks=False)


def _copy_out(source: Path, target: Path) -> None:
    """Copy a sandbox directory out: regular files and directories only, links left behind."""
    target.mkdir(parents=True, exist_ok=True)
    for dirpath, dirnames, filenames in os.walk(source):  # does not descend into linked dirs
        here = Path(dirpath)
        out = target / here.relative_to(source)
        for name in dirnames:
            if not (here / name).is_symlink():
                (out / name).mkdir(exist_ok=True)
        for name in filenames:
            f = here / name
            if not f.is_symlink() and f.is_file():
                shutil.copy2(f, out / name, follow_symlinks=False)
