"""The `local` sandbox: a fresh directory per rollout, under bubblewrap when it is installed.

Every command runs in its own session/process group with a scrubbed environment, rlimits and, where
the machine has them, a per-rollout cgroup (memory, processes, CPU) and a size-limited tmpfs as the
rollout directory (disk). Under bubblewrap the agent runs as an unprivileged uid, sees an
allow-list of system directories, and (network "proxy_only") reaches nothing but the capture
proxy. A timeout kills the whole group; before verify and in close() every process of the rollout
is killed (the cgroup's, and any carrying this sandbox's marker variable), so nothing the agent
started runs while its work is graded. Everything read back from the directory goes through
safefs: no link is followed, no FIFO opened blocking, nothing read unbounded.

Without bubblewrap ("plain") commands run as the server's user with no OS-level isolation: that
mode is not safe for an untrusted policy, and each result says so. Each command is still the init
of a PID namespace of its own (host.pid_namespace_argv), so nothing it started outlives it.

Every rollout directory has a lease beside it (lease.py), so what a killed owner left is swept at
the next start (sweep.py); close() detaches every mount below the directory before removing it.

This module decides; its neighbours know: host.py what the machine offers (bubblewrap, a uid to
run as, tmpfs mounts), bwrap.py the command line, limits.py and cgroups/ the resource limits,
processes.py how commands run and are killed, envvars.py the environment, safefs/ the files.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from harness_env.core.errors import SandboxError
from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.base import ExecResult
from harness_env.core.sandbox.bwrap import BwrapSpec, bwrap_argv, capture_url
from harness_env.core.sandbox.cgroups import RolloutCgroup
from harness_env.core.sandbox.envvars import MARKER_VAR, REWARD_FILE_VAR, SYSTEM_PATH, sandbox_env, verify_overrides
from harness_env.core.sandbox.gitguard import neutralise_git
from harness_env.core.sandbox.host import (  # bwrap_available, sandboxes_root: imported from here too
    bwrap_available,
    etc_secrets,
    pid_namespace_argv,
    root_entries,
    sandbox_user,
    sandboxes_root,
    unmount_tree,
)
from harness_env.core.sandbox.imageroot import HOST_INSIDE, IMAGE_PRELOAD, host_helpers
from harness_env.core.sandbox.images import TaskImage, ensure_image, release_image
from harness_env.core.sandbox.lease import lease_path
from harness_env.core.sandbox.limits import Limits, child_rlimits, entry_argv
from harness_env.core.sandbox.processes import RolloutProcesses
from harness_env.core.sandbox.processes import marked_pids as _marked_pids  # noqa: F401  (tests import it from here)
from harness_env.core.sandbox.rolloutdir import AGENT_DIRS, XDG_DIRS, make_rollout_dir
from harness_env.core.sandbox.setupfork import copied_note, fork_setup, overlay_refusal
from harness_env.core.sandbox.setuplayers import SetupLayer

REWARD_FILE_NAME = "reward.txt"
SKIP_DIRS = frozenset({".git", "node_modules", "__pycache__", ".venv", ".cache"})
PLAIN_UNSAFE_NOTE = (
    "bubblewrap not available: commands run as plain processes of the server's user (own directory, "
    "scrubbed environment, process group, limits) without OS-level isolation; NOT SAFE for an untrusted "
    "policy; install it with `apt-get install bubblewrap`"
)


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what `env NAME=VALUE` reads as an assignment


class LocalSandbox:
    """One rollout's directory and processes. Create with `create_local_sandbox`."""

    def __init__(
        self,
        root: Path,
        bwrap: str | None,
        ro_paths: list[str],
        limits: Limits,
        extra_binds: dict[str, str] | None = None,
        *,
        run_as: tuple[int, int] | None = None,
        cgroup: RolloutCgroup | None = None,
        tmpfs: bool = False,
        capture_socket: str | None = None,
        image: TaskImage | None = None,
        image_root: str | None = None,
        ran_in: str | None = None,
    ) -> None:
        self.root = root
        self.image = image  # the task's image, whose overlay (image_root, below root) is the commands' root
        self._image_root = image_root
        self.ran_in = ran_in  # the rollout directory the group's setup ran in: a link to this one inside
        self.sandbox_id = root.name
        self.limits = limits
        self._bwrap = bwrap
        self._ro_paths = ro_paths
        self._extra_binds = dict(extra_binds or {})
        self._root_entries = root_entries() if bwrap else []
        self._processes = RolloutProcesses(self.sandbox_id, cgroup)
        self._closed = False
        self._git_unchecked = False  # set at verify when some of the agent's git configs could not be checked
        self._verifying = False  # set by clear_reward_file: the verifier dir is writable from then on
        self._run_as = run_as
        self._cgroup = cgroup
        self._rlimits = child_rlimits(limits)
        self._tmpfs = tmpfs
        self._capture_socket = capture_socket
        self.backend = "bwrap" if bwrap else "plain"
        self.notes: list[str] = []
        self._pid_namespace = (pid_namespace_argv() or []) if not bwrap else []
        if not bwrap:
            self.notes.append(PLAIN_UNSAFE_NOTE)
            if not self._pid_namespace:
                self.notes.append(
                    "no PID namespace here (`unshare --pid` refused): a process that leaves the rollout's cgroup and drops its marker can outlive it"
                )
        if cgroup is None:
            self.notes.append("no cgroups here: memory, process and CPU limits are not enforced (rlimits only)")
        if limits.disk_bytes and not tmpfs:
            self.notes.append("no disk limit: the rollout directory is on the host's filesystem (a size-limited tmpfs needs a root server)")
        if bwrap and capture_socket is None:
            self.notes.append("network open: commands reach the host's network, the policy endpoint included")
        self.workspace = str(root / "workspace")
        self.home = str(root / "home")
        self.verifier_dir = str(root / "verifier")
        self.reward_file = str(root / "verifier" / REWARD_FILE_NAME)
        self.logs_dir = str(root / "logs")
        self.verify_home = str(root / "verify-home")

    @property
    def default_cwd(self) -> str:
        """Where commands start: the image's WorkingDir (the workspace is bound there), else the workspace."""
        return self.image.workdir if self.image is not None and self.image.workdir else self.workspace

    @property
    def network_isolated(self) -> bool:
        return self._capture_socket is not None

    def capture_base_url(self, host_url: str) -> str:
        """Where commands in this sandbox reach the capture proxy (`host_url` from the server)."""
        return capture_url() if self.network_isolated else host_url

    # -- environment and command lines ------------------------------------------------------
    def base_env(self, extra_path: list[str] | None = None) -> dict[str, str]:
        env = sandbox_env(
            sandbox_id=self.sandbox_id,
            home=self.home,
            tmp=str(self.root / "tmp"),
            xdg_root=str(self.root / "xdg"),
            workspace=self.workspace,
            extra_path=extra_path,
        )
        if self.image is None:
            return env
        # The host's side (the entry shell, bwrap, and the helpers that run as root inside) gets the
        # sandbox's own variables only: an image's LD_PRELOAD, GLIBC_TUNABLES or PATH would
        # otherwise choose what they load and run. The image's Env applies after the drop to the
        # sandbox's uid, to the image's programs alone (image_env).
        return {**env, "PWD": self.default_cwd}

    def image_env(self, given: dict[str, str], path_given: bool, extra_path: list[str] | None = None) -> dict[str, str]:
        """The image's Env for its programs, under what the sandbox and the caller set (`given`);
        its PATH replaces the host's unless the caller gave another (`path_given`)."""
        assert self.image is not None
        env = {k: v for k, v in self.image.env.items() if k not in given and ENV_NAME.fullmatch(k)}
        if not path_given:
            env["PATH"] = ":".join([*(extra_path or []), self.image.env.get("PATH") or SYSTEM_PATH])
        return env

    def verify_env(self) -> dict[str, str]:
        """Extra variables only verify commands get: where to write the reward, and a fresh HOME,
        XDG and TMPDIR with git, Python and npm told to ignore user config, so nothing the agent
        planted in its home (.gitconfig, .pth files, .npmrc) runs during verify."""
        env = {REWARD_FILE_VAR: self.reward_file, **verify_overrides(self.verify_home)}
        if self._git_unchecked:
            env["GIT_DIR"] = "/dev/null"  # configs the walk never reached: no repository at all, rather than theirs
        return env

    def _argv(self, cmd: str | list[str], cwd: str, open_network: bool, inner_env: dict[str, str] | None = None) -> list[str]:
        command = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not self._bwrap:
            return [*self._pid_namespace, *command]
        # The host's /etc is not shown in an image; the image's own ld.so.preload is hidden, as
        # the helpers that run as root inside go through a loader that would read it.
        files, dirs = etc_secrets() if self.image is None else ((IMAGE_PRELOAD,), ())
        writable = [str(self.root / d) for d in AGENT_DIRS]
        if self._verifying:
            writable.append(self.verify_home)
        spec = BwrapSpec(
            root_entries=self._root_entries,
            rollout_dir=str(self.root),
            sandboxes_dir=str(self.root.parent),
            workdir=cwd,
            verifier_dir=self.verifier_dir,
            ro_paths=self._ro_paths,
            extra_binds={**self._extra_binds, self.image.workdir: self.workspace} if self.image and self.image.workdir else self._extra_binds,
            writable_dirs=writable,
            verifier_writable=self._verifying,
            masked_paths=list(files),
            masked_dirs=list(dirs),
            tmpfs_size_bytes=self.limits.disk_bytes,
            run_as=self._run_as,
            capture_socket=None if open_network else self._capture_socket,
            image_root=self._image_root,
            host_dir=HOST_INSIDE,
            helpers=host_helpers() if self.image is not None else {},
            inner_env=inner_env or {},
            aliases={self.ran_in: str(self.root)} if self.ran_in else {},
        )
        return bwrap_argv(self._bwrap, spec, command)

    # -- processes --------------------------------------------------------------------------
    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        max_output: int = 1_000_000,
        on_stdout_line: Callable[[str], None] | None = None,
        stop: asyncio.Event | None = None,
        open_network: bool = False,
    ) -> ExecResult:
        """Run `cmd` (a shell line or argv); a timeout, a set `stop` event or cancellation kills
        its whole process group and the output read so far is kept. `open_network`: the host's
        network even in a sandbox whose network is cut (the task's setup commands)."""
        if self._closed:
            raise SandboxError(f"sandbox {self.sandbox_id} is closed")
        cwd = cwd or self.default_cwd
        full_env = self.base_env()
        host_path = full_env["PATH"]
        full_env.update(env or {})
        full_env[MARKER_VAR] = self.sandbox_id  # callers cannot drop the marker
        inner_env = self.image_env(full_env, full_env["PATH"] != host_path) if self.image is not None else None
        return await self._processes.run(
            entry_argv(self._rlimits, self._cgroup.procs_files if self._cgroup is not None else [], self._argv(cmd, cwd, open_network, inner_env)),
            env=full_env,
            cwd=cwd if self.image is None else self.workspace,  # the host's side of it: cwd may exist only inside the image
            timeout=timeout,
            max_output=max_output,
            on_stdout_line=on_stdout_line,
            stop=stop,
        )

    def alive_pids(self) -> list[int]:
        """Processes of this rollout still alive (zombies excluded). Empty after close()."""
        return self._processes.alive_pids(with_cgroup=not self._closed)

    def limits_hit(self) -> list[str]:
        """The resource limits the rollout ran into, in words."""
        hit = list(self._cgroup.limit_notes()) if self._cgroup is not None else []
        if self._tmpfs and self.limits.disk_bytes:
            try:
                st = os.statvfs(self.root)
                if st.f_bavail * st.f_frsize < max(1024**2, self.limits.disk_bytes // 100):
                    hit.append(f"the disk limit of {self.limits.disk_bytes // 1024**2} MiB was reached (raise disk_limit_mb)")
            except OSError:
                pass
        return hit

    # -- files ------------------------------------------------------------------------------
    def resolve(self, path: str) -> Path:
        """`path` (relative to the workspace, or absolute) on the host; outside the rollout's
        directory (after following symlinks) is an error. Only a name check: open what it gives
        with safefs, never with open()."""
        p = Path(path)
        full = (p if p.is_absolute() else Path(self.workspace) / p).resolve()
        if not full.is_relative_to(self.root.resolve()):
            raise SandboxError(f"path {path!r} is outside sandbox {self.sandbox_id}")
        return full

    def _relative(self, path: str) -> str:
        p = Path(path)
        full = p if p.is_absolute() else Path(self.workspace) / p
        try:
            rel = Path(os.path.normpath(full)).relative_to(self.root)
        except ValueError:
            raise SandboxError(f"path {path!r} is outside sandbox {self.sandbox_id}") from None
        return str(rel)

    def write_file(self, path: str, content: str | bytes) -> None:
        """Write a regular file below the rollout directory; no link on the way is followed and
        an existing FIFO, device or link in its place is an error, not a target."""
        data = content.encode() if isinstance(content, str) else content
        try:
            safefs.write_regular(self.root, self._relative(path), data, owner=self._run_as)
        except (OSError, ValueError) as e:
            raise SandboxError(f"could not write {path!r} in sandbox {self.sandbox_id}: {getattr(e, 'strerror', None) or e}") from e

    def read_file(self, path: str, max_bytes: int = 1_000_000) -> bytes | None:
        try:
            return safefs.read_regular(self.root, self._relative(path), max_bytes)
        except SandboxError:
            return None

    def collect_files(self) -> dict[str, str]:
        """Text files of the workspace, bounded in count and size (binary files, links and
        special files are skipped)."""
        out: dict[str, str] = {}
        total = 0
        cap = self.limits.collect_max_file_bytes
        for found in safefs.walk_files(self.workspace, skip_dirs=SKIP_DIRS, max_files=self.limits.collect_max_files * 4, max_bytes=cap):
            if len(out) >= self.limits.collect_max_files or total >= self.limits.collect_max_total_bytes:
                break
            if b"\0" in found.data[:8192]:
                continue
            text = found.data[:cap].decode("utf-8", errors="replace")
            if len(found.data) > cap:
                text += "\n[... truncated ...]"
            # A name that is not UTF-8 (os.scandir gives its bytes as lone surrogates) keeps its
            # bytes as \xNN escapes: a result's keys must serialise.
            out[os.fsencode(found.rel).decode("utf-8", "backslashreplace")] = text
            total += len(found.data)
        return out

    def clear_reward_file(self) -> None:
        """Start the verify phase: kill every process the agent left, replace whatever is at the
        verifier path (a link, a FIFO, a planted tree) with a fresh directory of the server's,
        reduce the agent's git configs to keys that start no program, and give verify commands a
        fresh home. Blocking: call it off the event loop."""
        self._processes.kill_all()
        for path in (self.verifier_dir, self.verify_home):
            problem = safefs.remove_tree(path)
            if problem:
                raise SandboxError(f"could not reset {path} before verify: {problem}")
        # Git in verify must not start a program the agent named in a repository's config.
        git = neutralise_git(self.root, AGENT_DIRS)
        self._git_unchecked = git.unchecked is not None
        self.notes.extend(git.notes())
        made = [self.verifier_dir, self.verify_home, *(os.path.join(self.verify_home, d) for d in ("tmp", "xdg", *XDG_DIRS))]
        for path in made:
            os.mkdir(path, 0o755)
            if self._run_as is not None:
                os.chown(path, *self._run_as, follow_symlinks=False)
        self._verifying = True

    def read_reward_file(self) -> str | None:
        data = safefs.read_regular(self.root, f"verifier/{REWARD_FILE_NAME}", 4096)
        return None if data is None else data.decode("utf-8", errors="replace")

    # -- lifecycle --------------------------------------------------------------------------
    async def close(self) -> str | None:
        """Kill every process of the rollout and remove its directory. Idempotent. Returns what
        could not be cleaned up, in words (also added to `notes`), or None; never raises."""
        if self._closed:
            return None
        self._closed = True
        await self._processes.stop_all()
        problem = await asyncio.to_thread(self._remove)
        if problem:
            self.notes.append(f"clean-up: {problem}")
        return problem

    def _remove(self) -> str | None:
        problems = []
        if self._cgroup is not None:
            self._cgroup.remove()  # never raises; what went wrong is in its notes
            problems.extend(self._cgroup.notes)
        # Every mount below the directory too (a root agent's own), so removal stays on the rollout's files.
        problem = unmount_tree(self.root) or safefs.remove_tree(self.root)
        if problem:
            problems.append(problem)
        else:
            lease_path(self.root).unlink(missing_ok=True)  # kept while anything is left: the next start sweeps it
        return "; ".join(problems) or None


def _usable_bwrap(use_bwrap: bool | None, extra_binds: dict[str, str] | None, image: str | TaskImage | None) -> str | None:
    """The bubblewrap to use (None: plain processes), or one SandboxError for arguments this host cannot serve."""
    if extra_binds and use_bwrap is False:
        raise SandboxError("extra_binds need bubblewrap; use_bwrap=False cannot map absolute paths")
    bwrap = bwrap_available() if use_bwrap is not False else None
    if (use_bwrap or extra_binds) and not bwrap:
        raise SandboxError("bubblewrap was required but `bwrap` is not usable; install it: apt-get install bubblewrap")
    for inside, rel in (extra_binds or {}).items():
        if not inside.startswith("/") or Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise SandboxError(f"extra bind {inside!r} -> {rel!r}: need an absolute inside path and a relative host dir")
    if image and not bwrap:
        raise SandboxError(f"task image {image!r} needs bubblewrap, which is not usable here; install it: apt-get install bubblewrap")
    if image and os.geteuid() != 0:
        raise SandboxError(f"task image {image!r} needs a root server: its writable layer is an overlay mount")
    return bwrap


def create_local_sandbox(
    *,
    use_bwrap: bool | None = None,
    ro_paths: list[str] | None = None,
    limits: Limits | None = None,
    extra_binds: dict[str, str] | None = None,
    capture_socket: str | None = None,
    unprivileged: bool | None = None,
    image: str | TaskImage | None = None,
    setup_layer: SetupLayer | None = None,
) -> LocalSandbox:
    """Make a fresh rollout directory. `use_bwrap=None` uses bubblewrap when it works here.

    `extra_binds` maps absolute paths inside the sandbox to subdirectories of the rollout directory
    (relative to it, created here), e.g. {"/tests": "harbor/tests"}; only bubblewrap can bind them,
    so they require it. `capture_socket`: the capture proxy's Unix socket; with bubblewrap and
    socat, commands then get no network but it. `unprivileged` (default: when possible and there
    are no extra binds, whose files the server writes as root): run commands as an unprivileged
    uid under bubblewrap. `image`: the task's image (images.py), pulled unless cached, as the root of
    every command (needs bubblewrap and a root server; a TaskImage: pulled already); its non-root
    numeric User is the uid. `setup_layer`: a group's setup to start from (setupfork.py)."""
    try:
        bwrap = _usable_bwrap(use_bwrap, extra_binds, image)
    except SandboxError:
        if isinstance(image, TaskImage):
            release_image(image.digest)  # held since its pull: it will not be mounted
        raise
    task_image = ensure_image(image) if isinstance(image, str) and image else image or None
    limits = limits or Limits()
    run_as = sandbox_user() if bwrap and (unprivileged if unprivileged is not None else not extra_binds) else None
    if run_as is not None and task_image is not None and task_image.user is not None and task_image.user[0] != 0:
        # The image's own user, never its root (nor root's group): files it owns in the image stay writable.
        run_as = (task_image.user[0], task_image.user[1] or run_as[1])
    if capture_socket is not None and (not bwrap or shutil.which("socat") is None):
        capture_socket = None  # no way to cut the network here; the sandbox's notes say so
    copy_why = overlay_refusal() if setup_layer is not None and task_image is not None else None  # else setupfork decides
    try:
        made = make_rollout_dir(sandboxes_root(), limits, run_as, extra_binds, task_image, setup_layer, setup_layer is not None and not copy_why)
    finally:
        if task_image is not None:
            release_image(task_image.digest)  # mounted now (the mount keeps it), or never
    sandbox = LocalSandbox(
        made.root,
        bwrap,
        ro_paths or [],
        limits,
        made.binds,
        run_as=run_as,
        cgroup=made.cgroup,
        tmpfs=made.tmpfs,
        capture_socket=capture_socket,
        image=task_image,
        image_root=made.image_root,
        ran_in=setup_layer.ran_in if setup_layer is not None else None,
    )
    if task_image is not None:
        sandbox.notes.append(f"root: task image {task_image.ref} ({task_image.digest})")
    try:
        sandbox.notes.extend([] if setup_layer is None else [copied_note(copy_why)] if copy_why else [fork_setup(setup_layer, made.root, AGENT_DIRS)])
    except BaseException:
        sandbox._remove()  # its directory, cgroup and lease: nothing is left of a sandbox never returned
        raise
    return sandbox
