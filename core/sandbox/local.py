"""The `local` sandbox: a fresh directory per rollout, under bubblewrap when it is installed.

Every command runs in its own session/process group with a scrubbed environment and resource
limits. A timeout kills the whole group; close() also kills any process carrying this sandbox's
marker variable (one that escaped the group with setsid) and removes the directory.
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness_env.core.errors import SandboxError
from harness_env.core.sandbox.base import ExecResult, TailBuffer, pump
from harness_env.core.sandbox.bwrap import BwrapSpec, RootEntry, bwrap_argv
from harness_env.core.sandbox.envvars import MARKER_VAR, REWARD_FILE_VAR, sandbox_env

REWARD_FILE_NAME = "reward.txt"
SKIP_DIRS = frozenset({".git", "node_modules", "__pycache__", ".venv", ".cache"})


@dataclass(frozen=True)
class Limits:
    open_files: int = 16_384
    processes: int = 4_096
    file_size_bytes: int = 2 * 1024**3
    collect_max_files: int = 200
    collect_max_file_bytes: int = 256 * 1024
    collect_max_total_bytes: int = 4 * 1024 * 1024


@functools.cache
def bwrap_available() -> str | None:
    """Path of a working bwrap, or None. Checked by running it once (it can exist but be denied)."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    try:
        import subprocess

        proc = subprocess.run(
            [path, "--ro-bind", "/", "/", "--unshare-pid", "--proc", "/proc", "--dev", "/dev", "true"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if proc.returncode == 0 else None


def sandboxes_root() -> Path:
    return Path(os.environ.get("HARNESS_ENV_SANDBOX_DIR") or Path(tempfile.gettempdir()) / "harness-env")


def _root_entries() -> list[RootEntry]:
    entries = []
    for name in sorted(os.listdir("/")):
        p = Path("/") / name
        if p.is_symlink():
            entries.append(RootEntry(name, symlink_target=os.readlink(p)))
        else:
            entries.append(RootEntry(name, is_dir=p.is_dir()))
    return entries


def _preexec(limits: Limits) -> Callable[[], None]:
    def apply() -> None:
        for res, value in (
            (resource.RLIMIT_NOFILE, limits.open_files),
            (resource.RLIMIT_NPROC, limits.processes),
            (resource.RLIMIT_FSIZE, limits.file_size_bytes),
            (resource.RLIMIT_CORE, 0),
        ):
            try:
                soft, hard = resource.getrlimit(res)
                cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
                resource.setrlimit(res, (cap, cap))
            except (ValueError, OSError):
                pass  # the OS refuses this limit here; the others still apply

    return apply


def _marked_pids(sandbox_id: str) -> list[int]:
    """PIDs whose environment carries this sandbox's marker."""
    needle = f"{MARKER_VAR}={sandbox_id}\0".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return [p for p in pids if p != os.getpid()]


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class LocalSandbox:
    """One rollout's directory and processes. Create with `create_local_sandbox`."""

    def __init__(
        self,
        root: Path,
        bwrap: str | None,
        ro_paths: list[str],
        limits: Limits,
        extra_binds: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        self.sandbox_id = root.name
        self.limits = limits
        self._bwrap = bwrap
        self._ro_paths = ro_paths
        self._extra_binds = dict(extra_binds or {})
        self._root_entries = _root_entries() if bwrap else []
        self._procs: set[asyncio.subprocess.Process] = set()
        self._closed = False
        self.backend = "bwrap" if bwrap else "plain"
        self.notes: list[str] = []
        if not bwrap:
            self.notes.append(
                "bubblewrap not available: commands run as plain processes (own directory, scrubbed "
                "environment, process group, limits) without OS-level isolation; install it with "
                "`apt-get install bubblewrap`"
            )
        self.workspace = str(root / "workspace")
        self.home = str(root / "home")
        self.verifier_dir = str(root / "verifier")
        self.reward_file = str(root / "verifier" / REWARD_FILE_NAME)
        self.logs_dir = str(root / "logs")

    # -- environment and command lines ------------------------------------------------------
    def base_env(self, extra_path: list[str] | None = None) -> dict[str, str]:
        return sandbox_env(
            sandbox_id=self.sandbox_id,
            home=self.home,
            tmp=str(self.root / "tmp"),
            xdg_root=str(self.root / "xdg"),
            workspace=self.workspace,
            extra_path=extra_path,
        )

    def verify_env(self) -> dict[str, str]:
        """Extra variables only verify commands get: where to write the reward."""
        return {REWARD_FILE_VAR: self.reward_file}

    def _argv(self, cmd: str | list[str], cwd: str) -> list[str]:
        command = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not self._bwrap:
            return command
        spec = BwrapSpec(
            root_entries=self._root_entries,
            rollout_dir=str(self.root),
            sandboxes_dir=str(self.root.parent),
            workdir=cwd,
            verifier_dir=self.verifier_dir,
            ro_paths=self._ro_paths,
            extra_binds=self._extra_binds,
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
    ) -> ExecResult:
        """Run `cmd` (a shell line or argv); a timeout, a set `stop` event or cancellation kills
        its whole process group and the output read so far is kept."""
        if self._closed:
            raise SandboxError(f"sandbox {self.sandbox_id} is closed")
        cwd = cwd or self.workspace
        full_env = self.base_env()
        full_env.update(env or {})
        full_env[MARKER_VAR] = self.sandbox_id  # callers cannot drop the marker
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._argv(cmd, cwd),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=full_env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_preexec(self.limits),
            )
        except OSError as e:
            raise SandboxError(f"could not start a command in sandbox {self.sandbox_id}: {e}") from e
        self._procs.add(proc)
        out, err = TailBuffer(max_output), TailBuffer(max_output)
        assert proc.stdout is not None and proc.stderr is not None
        readers = asyncio.gather(pump(proc.stdout, out, on_stdout_line), pump(proc.stderr, err))
        timed_out = stopped = False
        try:
            waiter = asyncio.ensure_future(proc.wait())
            stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
            try:
                await asyncio.wait({waiter, *([stopper] if stopper else [])}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if stopper is not None:
                    stopper.cancel()
            if not waiter.done():
                stopped = stop is not None and stop.is_set()
                timed_out = not stopped
            # Kill what the command left in its group (background children), then drain pipes.
            _kill_group(proc.pid)
            if timed_out or stopped:
                self._kill_marked()
            try:
                await asyncio.wait_for(asyncio.shield(readers), 5)
            except TimeoutError:
                self._kill_marked()  # an escaped process holds the pipe open
                readers.cancel()
            await proc.wait()
        except BaseException:
            _kill_group(proc.pid)
            readers.cancel()
            raise
        finally:
            self._procs.discard(proc)
        return ExecResult(
            exit_code=None if timed_out or stopped else proc.returncode,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=time.monotonic() - started,
            timed_out=timed_out,
            stopped=stopped,
            stdout_dropped=out.dropped,
            stderr_dropped=err.dropped,
        )

    def _kill_marked(self) -> int:
        pids = _marked_pids(self.sandbox_id)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return len(pids)

    def alive_pids(self) -> list[int]:
        """Processes of this rollout still alive (zombies excluded). Empty after close()."""
        alive = []
        for pid in _marked_pids(self.sandbox_id):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except (OSError, IndexError):
                continue
        return alive

    # -- files ------------------------------------------------------------------------------
    def resolve(self, path: str) -> Path:
        """`path` (relative to the workspace, or absolute) on the host; outside the rollout's
        directory (after following symlinks) is an error."""
        p = Path(path)
        full = (p if p.is_absolute() else Path(self.workspace) / p).resolve()
        if not full.is_relative_to(self.root.resolve()):
            raise SandboxError(f"path {path!r} is outside sandbox {self.sandbox_id}")
        return full

    def write_file(self, path: str, content: str | bytes) -> None:
        full = self.resolve(path)
        full.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        full.write_bytes(data)

    def read_file(self, path: str, max_bytes: int = 1_000_000) -> bytes | None:
        try:
            full = self.resolve(path)
            with open(full, "rb") as f:
                return f.read(max_bytes)
        except (OSError, SandboxError):
            return None

    def collect_files(self) -> dict[str, str]:
        """Text files of the workspace, bounded in count and size (binary files are skipped)."""
        out: dict[str, str] = {}
        total = 0
        ws = Path(self.workspace)
        for dirpath, dirnames, filenames in os.walk(ws):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                if len(out) >= self.limits.collect_max_files or total >= self.limits.collect_max_total_bytes:
                    return out
                full = Path(dirpath) / name
                if full.is_symlink() or not full.is_file():
                    continue
                with open(full, "rb") as f:
                    data = f.read(self.limits.collect_max_file_bytes + 1)
                if b"\0" in data[:8192]:
                    continue
                text = data[: self.limits.collect_max_file_bytes].decode("utf-8", errors="replace")
                if len(data) > self.limits.collect_max_file_bytes:
                    text += "\n[... truncated ...]"
                out[str(full.relative_to(ws))] = text
                total += len(data)
        return out

    def clear_reward_file(self) -> None:
        shutil.rmtree(self.verifier_dir, ignore_errors=True)
        Path(self.verifier_dir).mkdir(parents=True, exist_ok=True)

    def read_reward_file(self) -> str | None:
        data = self.read_file(self.reward_file, max_bytes=4096)
        return None if data is None else data.decode("utf-8", errors="replace")

    # -- lifecycle --------------------------------------------------------------------------
    async def close(self) -> None:
        """Kill every process of the rollout and remove its directory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for proc in list(self._procs):
            _kill_group(proc.pid)
        for _ in range(50):
            if not self._kill_marked():
                break
            await asyncio.sleep(0.05)
        for proc in list(self._procs):
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                pass
        await asyncio.to_thread(_remove_tree, self.root)


def _remove_tree(root: Path) -> None:
    def onexc(func, path, exc):  # read-only dirs made by the agent: make writable, retry
        try:
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            func(path)
        except OSError:
            pass

    shutil.rmtree(root, onexc=onexc)


def create_local_sandbox(
    *,
    use_bwrap: bool | None = None,
    ro_paths: list[str] | None = None,
    limits: Limits | None = None,
    extra_binds: dict[str, str] | None = None,
) -> LocalSandbox:
    """Make a fresh rollout directory. `use_bwrap=None` uses bubblewrap when it works here.

    `extra_binds` maps absolute paths inside the sandbox to subdirectories of the rollout directory
    (relative to it, created here), e.g. {"/tests": "harbor/tests"}; only bubblewrap can bind them,
    so they require it."""
    if extra_binds and use_bwrap is False:
        raise SandboxError("extra_binds need bubblewrap; use_bwrap=False cannot map absolute paths")
    bwrap = bwrap_available() if use_bwrap is not False else None
    if (use_bwrap or extra_binds) and not bwrap:
        raise SandboxError("bubblewrap was required but `bwrap` is not usable; install it: apt-get install bubblewrap")
    for inside, rel in (extra_binds or {}).items():
        if not inside.startswith("/") or Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise SandboxError(f"extra bind {inside!r} -> {rel!r}: need an absolute inside path and a relative host dir")
    base = sandboxes_root()
    try:
        base.mkdir(parents=True, exist_ok=True)
        root = base / f"rollout-{uuid.uuid4().hex[:12]}"
        root.mkdir(mode=0o700)
        for sub in ("workspace", "home", "tmp", "xdg/config", "xdg/cache", "xdg/data", "xdg/state", "verifier", "logs"):
            (root / sub).mkdir(parents=True)
        binds = {}
        for inside, rel in (extra_binds or {}).items():
            (root / rel).mkdir(parents=True, exist_ok=True)
            binds[inside] = str(root / rel)
    except OSError as e:
        raise SandboxError(f"could not create the sandbox directory under {base}: {e}") from e
    return LocalSandbox(root, bwrap, ro_paths or [], limits or Limits(), binds)
