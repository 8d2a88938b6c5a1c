"""Where rollout cgroups go on this machine: detecting the hierarchy (v1 or v2) this process may
use, reading and writing cgroupfs, and making and removing the per-server directories.

Layout: every cgroup lives under one parent named `harness-env`, then one directory per server
process (`server-<pid>-<starttime>`), then one per rollout (the sandbox id). Making and removing
these directories is serialised by one lock per process (re-made in a forked child).
"""

from __future__ import annotations

import errno
import functools
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from harness_env.core.errors import SandboxError
from harness_env.core.procs import process_starttime
from harness_env.core.sandbox.cgroups.values import V1_CONTROLLERS, V2_CONTROLLERS, parse_v1_mounts, parse_v2_mount, parse_v2_own_path

PARENT_NAME = "harness-env"
LEAF_NAME = "harness-env-server"  # v2: where the server's processes move so its cgroup can delegate
REQUIRED = ("memory", "pids")  # without these a rollout is not bounded; cpu and freezer are optional


# -- cgroupfs access -----------------------------------------------------------------------------
def read_text(path: Path) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def write_value(path: Path, value: str) -> None:
    # One write() per value: cgroupfs parses each write call on its own.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def read_pids(procs: Path) -> list[int]:
    try:
        return [int(x) for x in read_text(procs).split()]
    except FileNotFoundError:
        return []


_OWNER: dict[int, str] = {}


def owner_name() -> str:
    """This process's directory name. Per pid, not cached once: a forked worker is a server of its
    own, whose rollouts must not look stale when the parent exits."""
    pid = os.getpid()
    if pid not in _OWNER:
        _OWNER[pid] = f"server-{pid}-{process_starttime(pid)}"
    return _OWNER[pid]


def owner_alive(owner: str) -> bool:
    """Whether the server that made `owner` (server-<pid>-<start>) still runs. A pid in another
    pid namespace looks dead from here: share one cgroup tree only within one pid namespace."""
    m = re.fullmatch(r"server-(\d+)-(\d+)", owner)
    return bool(m) and process_starttime(int(m.group(1))) == m.group(2)


# -- detection -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """Where rollout cgroups go on this machine."""

    version: str  # "v1" or "v2"
    parents: dict[str, Path]  # controller -> its `harness-env` dir (v2: the same dir for all)
    v2_base: Path | None = None  # v2: the cgroup that holds `harness-env` (it must delegate)
    v2_enable: tuple[str, ...] = ()  # v2: controllers to enable for the subtree

    @property
    def dirs(self) -> list[Path]:
        return list(dict.fromkeys(self.parents.values()))


def v1_layout(mounts: str) -> tuple[Layout | None, str]:
    found = parse_v1_mounts(mounts)
    missing = [c for c in REQUIRED if c not in found]
    if missing:
        return None, f"cgroup v1 controller(s) {', '.join(missing)} not mounted"
    for c, mount in list(found.items()):
        if not os.access(mount, os.W_OK):
            if c in REQUIRED:
                return None, (f"{mount} (cgroup v1 {c}) is not writable: run the server as root with a writable /sys/fs/cgroup")
            del found[c]  # optional (cpu, freezer): do without
    return Layout("v1", {c: found[c] / PARENT_NAME for c in V1_CONTROLLERS if c in found}), ""


def v2_layout(mount: Path, required: tuple[str, ...] = REQUIRED) -> tuple[Layout | None, str]:
    """The layout under this process's own v2 cgroup (or its parent when the server already moved
    into our leaf). `required`: controllers that must be delegated to it."""
    try:
        own = parse_v2_own_path(read_text(Path("/proc/self/cgroup")))
    except OSError as e:
        return None, f"cannot read /proc/self/cgroup: {e}"
    if own is None:
        return None, "this process has no cgroup v2 path"
    base = mount / own.lstrip("/")
    if base.name == LEAF_NAME:
        base = base.parent
    try:
        available = read_text(base / "cgroup.controllers").split()
    except OSError as e:
        return None, f"cannot read {base}/cgroup.controllers: {e}"
    missing = [c for c in required if c not in available]
    if missing:
        return None, (f"cgroup v2 controller(s) {', '.join(missing)} not available in {base} (cgroup.controllers: {' '.join(available) or 'none'})")
    if not os.access(base, os.W_OK):
        return None, f"{base} is not writable: run the server as root or in a delegated cgroup"
    enable = tuple(c for c in V2_CONTROLLERS if c in available)
    return Layout("v2", dict.fromkeys(("cgroup", *enable), base / PARENT_NAME), base, enable), ""


@functools.cache
def detect() -> tuple[Layout | None, str]:
    try:
        mounts = read_text(Path("/proc/self/mounts"))
    except OSError as e:
        return None, f"cannot read /proc/self/mounts: {e}"
    v2_mount = parse_v2_mount(mounts)
    problems = []
    if v2_mount is not None:
        layout, why = v2_layout(v2_mount)
        if layout is not None:
            return layout, ""
        problems.append(why)
    layout, why = v1_layout(mounts)
    if layout is not None:
        return layout, ""
    problems.append(why)
    return None, "; ".join(problems)


def cgroup_support() -> str | None:
    """'v1', 'v2', or None when this process cannot create limited cgroups (cached)."""
    layout, _ = detect()
    return layout.version if layout else None


def cgroup_unsupported_reason() -> str:
    """Why cgroup_support() is None ('' when it is not): for a note and the fallback's log line."""
    return detect()[1]


# -- per-server parent directories ---------------------------------------------------------------
# The CPU weight of every sandbox together against one ordinary process (v1 cpu.shares 1024, v2
# cpu.weight 100): an eighth. When the CPU is contended, the server (whose event loop carries every
# rollout's model calls) comes first, so no rollout's commands can starve the others' turns (at 256
# white-box rollouts on 2 cores the loop's lag p99 went from 42-69 ms to 14 ms); the sandboxes still
# get every cycle the server leaves.
SANDBOXES_CPU_WEIGHT = {"v1": ("cpu.shares", "128"), "v2": ("cpu.weight", "12")}
_PARENT_LOCK = threading.Lock()  # create vs. remove of this server's own directory, across threads


def _reset_lock_after_fork() -> None:
    global _PARENT_LOCK
    _PARENT_LOCK = threading.Lock()  # another thread may have held it at fork time


os.register_at_fork(after_in_child=_reset_lock_after_fork)


def _v2_delegate(layout: Layout) -> None:
    """Enable the controllers for children of the server's cgroup. A non-root cgroup with processes
    cannot (EBUSY, 'no internal processes'): move them into a leaf first."""
    base = layout.v2_base
    assert base is not None
    value = " ".join(f"+{c}" for c in layout.v2_enable)
    if not value or set(layout.v2_enable) <= set(read_text(base / "cgroup.subtree_control").split()):
        return
    try:
        write_value(base / "cgroup.subtree_control", value)
        return
    except OSError as e:
        if e.errno != errno.EBUSY:
            raise
    leaf = base / LEAF_NAME
    leaf.mkdir(exist_ok=True)
    for pid in read_pids(base / "cgroup.procs"):
        try:
            write_value(leaf / "cgroup.procs", str(pid))
        except ProcessLookupError:
            pass
    write_value(base / "cgroup.subtree_control", value)


def _make_dirs(layout: Layout, name: str, made: list[Path]) -> None:
    """mkdir harness-env/<owner>/<name> in every hierarchy, appending each rollout dir to `made`.
    ENOENT is retried: another server may just have removed the shared parent it found empty."""
    for parent in layout.dirs:
        owner = parent / owner_name()
        for attempt in range(5):
            try:
                for d in (parent, owner):
                    try:
                        d.mkdir()
                    except FileExistsError:
                        pass
                    if layout.version == "v2" and layout.v2_enable:
                        write_value(d / "cgroup.subtree_control", " ".join(f"+{c}" for c in layout.v2_enable))
                (owner / name).mkdir()
                break
            except FileNotFoundError:
                if attempt == 4:
                    raise
        made.append(owner / name)


def _weigh_sandboxes(layout: Layout) -> None:
    """SANDBOXES_CPU_WEIGHT on the shared parent, where the machine has the cpu controller (each
    time: another server or an older version may have made the parent)."""
    cpu = layout.parents.get("cpu")
    if cpu is None:
        return
    name, value = SANDBOXES_CPU_WEIGHT[layout.version]
    try:
        write_value(cpu / name, value)
    except OSError:
        pass  # the weight is a priority, not a limit: rollouts run the same without it


def _rmdir_parents(layout: Layout) -> None:
    """Remove this server's directory and the shared parent when empty; busy ones stay."""
    for parent in layout.dirs:
        for d in (parent / owner_name(), parent):
            try:
                d.rmdir()
            except OSError:
                break  # not empty (other rollouts, other servers) or gone


def make_rollout_dirs(layout: Layout, name: str) -> list[Path]:
    """Make rollout `name`'s directory in every hierarchy of `layout` (one per entry of
    layout.dirs, in order), delegating the controllers first on v2. On failure nothing is left and
    a SandboxError says why."""
    made: list[Path] = []
    with _PARENT_LOCK:
        try:
            if layout.version == "v2":
                _v2_delegate(layout)
            _make_dirs(layout, name, made)
            _weigh_sandboxes(layout)
        except OSError as e:
            for d in made:
                try:
                    d.rmdir()
                except OSError:
                    pass
            _rmdir_parents(layout)
            if isinstance(e, FileExistsError):
                raise SandboxError(f"cgroup {name} already exists: sandbox ids must be unique") from None
            raise SandboxError(f"could not create cgroup {name}: {e}") from e
    return made


def remove_parents(layout: Layout, owner: str | None = None) -> None:
    """Remove the directory of server `owner` (default: this process) where it is empty, and the
    shared parent too when this process's own directory went."""
    with _PARENT_LOCK:
        if owner is None:
            _rmdir_parents(layout)
            return
        for parent in layout.dirs:
            try:
                (parent / owner).rmdir()
            except OSError:
                pass
