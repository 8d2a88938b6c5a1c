"""Per-rollout resource limits with cgroups (v1 or v2), for the local sandbox.

rlimits are per process (RLIMIT_NPROC even counts per uid, so root ignores it): they cannot bound a
rollout's memory or a fork bomb. A cgroup can, and it also names every process of the rollout,
including one that left its session with setsid, so a rollout can be killed completely.

Layout: every cgroup lives under one parent named `harness-env`, then one directory per server
process (`server-<pid>-<starttime>`), then one per rollout (the sandbox id):
  v1: <mount of each controller>/harness-env/server-<pid>-<start>/<name>  (memory, pids, cpu, freezer)
  v2: <the server's own cgroup>/harness-env/server-<pid>-<start>/<name>
The per-server level lets `sweep_stale` at start-up tell a dead server's leftovers from the live
rollouts of another server (or test run) on the same machine.

Processes join with `join_in_child` in a preexec_fn, so the harness is limited from its first
instruction and everything it forks inherits the cgroup.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from harness_env.core.errors import SandboxError
from harness_env.core.procs import process_starttime, stat_starttime  # noqa: F401  (stat_starttime: re-exported)

PARENT_NAME = "harness-env"
LEAF_NAME = "harness-env-server"  # v2: where the server's processes move so its cgroup can delegate
CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel refuses quotas below 1 ms
REQUIRED = ("memory", "pids")  # without these a rollout is not bounded; cpu and freezer are optional
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
V2_CONTROLLERS = ("memory", "pids", "cpu")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
MiB = 1024 * 1024


@dataclass(frozen=True)
class ResourceLimits:
    memory_bytes: int | None  # hard limit, swap included (v1 memsw, v2 swap.max=0)
    pids: int | None  # processes and threads at once
    cpu_cores: float | None  # CFS quota in cores (1.5 = one and a half CPUs' time)

    def __post_init__(self) -> None:
        if self.memory_bytes is not None and self.memory_bytes < MiB:
            raise ValueError(f"memory_bytes must be at least 1 MiB, got {self.memory_bytes}")
        if self.pids is not None and self.pids < 1:
            raise ValueError(f"pids must be at least 1, got {self.pids}")
        if self.cpu_cores is not None and not (math.isfinite(self.cpu_cores) and self.cpu_cores > 0):
            raise ValueError(f"cpu_cores must be a positive number, got {self.cpu_cores}")


@dataclass(frozen=True)
class CgroupUsage:
    memory_peak_bytes: int | None  # None where the kernel does not keep a peak (v2 before 5.19)
    oom_kills: int  # processes the OOM killer killed in this cgroup
    memory_limit_hit: bool  # usage reached the limit (reclaim or OOM); page cache alone can do this
    pids_limit_hit: bool  # a fork or clone failed on pids.max
    pids_limit_events: int = 0  # how many times


# -- pure helpers (no root, no cgroupfs) ---------------------------------------------------------
def cpu_quota_us(cores: float | None, period_us: int = CPU_PERIOD_US) -> int | None:
    """CFS quota per period for `cores`, or None for no limit."""
    if cores is None:
        return None
    return max(MIN_CPU_QUOTA_US, round(cores * period_us))


def cpu_max_value(cores: float | None, period_us: int = CPU_PERIOD_US) -> str:
    """v2 cpu.max: '<quota> <period>' or 'max <period>'."""
    quota = cpu_quota_us(cores, period_us)
    return f"{'max' if quota is None else quota} {period_us}"


def max_value(n: int | None) -> str:
    """v2 memory.max / pids.max and v1 pids.max: the number, or 'max'."""
    return "max" if n is None else str(n)


def parse_keyed(text: str) -> dict[str, int]:
    """'key value' lines (memory.events, pids.events, memory.oom_control, cgroup.events)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_v1_mounts(mounts: str) -> dict[str, Path]:
    """Controller -> mount point of each v1 hierarchy, from /proc/self/mounts."""
    out: dict[str, Path] = {}
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup":
            for opt in parts[3].split(","):
                if opt in V1_CONTROLLERS:
                    out.setdefault(opt, Path(parts[1]))
    return out


def parse_v2_mount(mounts: str) -> Path | None:
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "cgroup2":
            return Path(parts[1])
    return None


def parse_v2_own_path(proc_cgroup: str) -> str | None:
    """The v2 path ('0::/a/b') in /proc/<pid>/cgroup, or None."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def limit_notes_for(limits: ResourceLimits, usage: CgroupUsage) -> list[str]:
    """Sentences for a result: which limit the rollout hit. Only OOM kills are reported for memory:
    reaching the limit alone is normal for page cache, which the kernel reclaims."""
    notes = []
    if usage.oom_kills and limits.memory_bytes is not None:
        n = usage.oom_kills
        notes.append(
            f"memory limit of {limits.memory_bytes // MiB} MiB was hit "
            f"({n} OOM kill{'' if n == 1 else 's'})"
        )
    if usage.pids_limit_hit and limits.pids is not None:
        n = usage.pids_limit_events
        notes.append(
            f"process limit of {limits.pids} was hit ({n} failed fork{'' if n == 1 else 's'})"
        )
    return notes


# -- cgroupfs access -----------------------------------------------------------------------------
def _read(path: Path) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def _write(path: Path, value: str) -> None:
    # One write() per value: cgroupfs parses each write call on its own.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read_pids(procs: Path) -> list[int]:
    try:
        return [int(x) for x in _read(procs).split()]
    except FileNotFoundError:
        return []


_OWNER: dict[int, str] = {}


def _owner_name() -> str:
    """This process's directory name. Per pid, not cached once: a forked worker is a server of its
    own, whose rollouts must not look stale when the parent exits."""
    pid = os.getpid()
    if pid not in _OWNER:
        _OWNER[pid] = f"server-{pid}-{process_starttime(pid)}"
    return _OWNER[pid]


def _owner_alive(owner: str) -> bool:
    """Whether the server that made `owner` (server-<pid>-<start>) still runs. A pid in another
    pid namespace looks dead from here: share one cgroup tree only within one pid namespace."""
    m = re.fullmatch(r"server-(\d+)-(\d+)", owner)
    return bool(m) and process_starttime(int(m.group(1))) == m.group(2)


@dataclass(frozen=True)
class _Layout:
    """Where rollout cgroups go on this machine."""

    version: str  # "v1" or "v2"
    parents: dict[str, Path]  # controller -> its `harness-env` dir (v2: the same dir for all)
    v2_base: Path | None = None  # v2: the cgroup that holds `harness-env` (it must delegate)
    v2_enable: tuple[str, ...] = ()  # v2: controllers to enable for the subtree

    @property
    def dirs(self) -> list[Path]:
        return list(dict.fromkeys(self.parents.values()))


def _v1_layout(mounts: str) -> tuple[_Layout | None, str]:
    found = parse_v1_mounts(mounts)
    missing = [c for c in REQUIRED if c not in found]
    if missing:
        return None, f"cgroup v1 controller(s) {', '.join(missing)} not mounted"
    for c, mount in list(found.items()):
        if not os.access(mount, os.W_OK):
            if c in REQUIRED:
                return None, (
                    f"{mount} (cgroup v1 {c}) is not writable: run the server as root with a "
                    "writable /sys/fs/cgroup"
                )
            del found[c]  # optional (cpu, freezer): do without
    return _Layout("v1", {c: found[c] / PARENT_NAME for c in V1_CONTROLLERS if c in found}), ""


def _v2_layout(mount: Path, required: tuple[str, ...] = REQUIRED) -> tuple[_Layout | None, str]:
    """The layout under this process's own v2 cgroup (or its parent when the server already moved
    into our leaf). `required`: controllers that must be delegated to it."""
    try:
        own = parse_v2_own_path(_read(Path("/proc/self/cgroup")))
    except OSError as e:
        return None, f"cannot read /proc/self/cgroup: {e}"
    if own is None:
        return None, "this process has no cgroup v2 path"
    base = mount / own.lstrip("/")
    if base.name == LEAF_NAME:
        base = base.parent
    try:
        available = _read(base / "cgroup.controllers").split()
    except OSError as e:
        return None, f"cannot read {base}/cgroup.controllers: {e}"
    missing = [c for c in required if c not in available]
    if missing:
        return None, (
            f"cgroup v2 controller(s) {', '.join(missing)} not available in {base} "
            f"(cgroup.controllers: {' '.join(available) or 'none'})"
        )
    if not os.access(base, os.W_OK):
        return None, f"{base} is not writable: run the server as root or in a delegated cgroup"
    enable = tuple(c for c in V2_CONTROLLERS if c in available)
    return _Layout("v2", dict.fromkeys(("cgroup", *enable), base / PARENT_NAME), base, enable), ""


@functools.cache
def _detect() -> tuple[_Layout | None, str]:
    try:
        mounts = _read(Path("/proc/self/mounts"))
    except OSError as e:
        return None, f"cannot read /proc/self/mounts: {e}"
    v2_mount = parse_v2_mount(mounts)
    problems = []
    if v2_mount is not None:
        layout, why = _v2_layout(v2_mount)
        if layout is not None:
            return layout, ""
        problems.append(why)
    layout, why = _v1_layout(mounts)
    if layout is not None:
        return layout, ""
    problems.append(why)
    return None, "; ".join(problems)


def cgroup_support() -> str | None:
    """'v1', 'v2', or None when this process cannot create limited cgroups (cached)."""
    layout, _ = _detect()
    return layout.version if layout else None


def cgroup_unsupported_reason() -> str:
    """Why cgroup_support() is None ('' when it is not): for a note and the fallback's log line."""
    return _detect()[1]


# -- per-server parent directories ---------------------------------------------------------------
_PARENT_LOCK = threading.Lock()  # create vs. remove of this server's own directory, across threads


def _reset_lock_after_fork() -> None:
    global _PARENT_LOCK
    _PARENT_LOCK = threading.Lock()  # another thread may have held it at fork time


os.register_at_fork(after_in_child=_reset_lock_after_fork)


def _v2_delegate(layout: _Layout) -> None:
    """Enable the controllers for children of the server's cgroup. A non-root cgroup with processes
    cannot (EBUSY, 'no internal processes'): move them into a leaf first."""
    base = layout.v2_base
    assert base is not None
    value = " ".join(f"+{c}" for c in layout.v2_enable)
    if not value or set(layout.v2_enable) <= set(_read(base / "cgroup.subtree_control").split()):
        return
    try:
        _write(base / "cgroup.subtree_control", value)
        return
    except OSError as e:
        if e.errno != errno.EBUSY:
            raise
    leaf = base / LEAF_NAME
    leaf.mkdir(exist_ok=True)
    for pid in _read_pids(base / "cgroup.procs"):
        try:
            _write(leaf / "cgroup.procs", str(pid))
        except ProcessLookupError:
            pass
    _write(base / "cgroup.subtree_control", value)


def _make_dirs(layout: _Layout, name: str, made: list[Path]) -> None:
    """mkdir harness-env/<owner>/<name> in every hierarchy, appending each rollout dir to `made`.
    ENOENT is retried: another server may just have removed the shared parent it found empty."""
    for parent in layout.dirs:
        owner = parent / _owner_name()
        for attempt in range(5):
            try:
                for d in (parent, owner):
                    try:
                        d.mkdir()
                    except FileExistsError:
                        pass
                    if layout.version == "v2" and layout.v2_enable:
                        _write(d / "cgroup.subtree_control", " ".join(f"+{c}" for c in layout.v2_enable))
                (owner / name).mkdir()
                break
            except FileNotFoundError:
                if attempt == 4:
                    raise
        made.append(owner / name)


def _rmdir_parents(layout: _Layout) -> None:
    """Remove this server's directory and the shared parent when empty; busy ones stay."""
    for parent in layout.dirs:
        for d in (parent / _owner_name(), parent):
            try:
                d.rmdir()
            except OSError:
                break  # not empty (other rollouts, other servers) or gone


# -- one rollout ---------------------------------------------------------------------------------
class RolloutCgroup:
    """One rollout's cgroup(s): limits, membership, usage, kill and removal."""

    use_cgroup_kill = True  # v2: cgroup.kill where the kernel has it (tests turn it off for the freeze path)

    def __init__(self, layout: _Layout, name: str, limits: ResourceLimits, dirs: dict[str, Path]) -> None:
        self.layout = layout
        self.name = name
        self.limits = limits
        self._dirs = dirs  # controller -> this rollout's dir in its hierarchy
        self.dirs = list(dict.fromkeys(dirs.values()))
        # Encoded up front: join_in_child runs between fork and exec and must not allocate much.
        self._procs_files = tuple(os.fsencode(d / "cgroup.procs") for d in self.dirs)
        self.notes: list[str] = []  # what kill_all/remove could not do
        self._removed = False
        self._final_usage: CgroupUsage | None = None  # read just before removal, for the result

    @classmethod
    def create(cls, name: str, limits: ResourceLimits) -> RolloutCgroup | None:
        """The cgroup for sandbox `name` with `limits`, or None where cgroups are unsupported."""
        layout, _ = _detect()
        if layout is None:
            return None
        return cls._create(layout, name, limits)

    @classmethod
    def _create(cls, layout: _Layout, name: str, limits: ResourceLimits) -> RolloutCgroup:
        if not _NAME_RE.fullmatch(name):
            raise SandboxError(f"invalid cgroup name {name!r}: use letters, digits, '_', '.', '-'")
        if limits.cpu_cores is not None and "cpu" not in layout.parents:
            raise SandboxError(
                "a cpu limit was asked for but the cpu cgroup controller is not available here; "
                "leave cpu_cores unset"
            )
        made: list[Path] = []
        with _PARENT_LOCK:
            try:
                if layout.version == "v2":
                    _v2_delegate(layout)
                _make_dirs(layout, name, made)
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
        by_parent = dict(zip(layout.dirs, made, strict=True))
        cg = cls(layout, name, limits, {c: by_parent[p] for c, p in layout.parents.items()})
        try:
            cg._apply_limits()
        except OSError as e:
            cg.remove()
            raise SandboxError(f"could not set limits on cgroup {name} ({limits}): {e}") from e
        return cg

    def _apply_limits(self) -> None:
        lim = self.limits
        mem, pids, cpu = self._dirs.get("memory"), self._dirs.get("pids"), self._dirs.get("cpu")
        if self.layout.version == "v1":
            if mem is not None:
                _write(mem / "memory.oom_control", "0")  # the OOM killer acts (rather than pausing)
                if lim.memory_bytes is not None:
                    # limit first: memsw must never be below it. memsw: swap cannot extend the limit.
                    _write(mem / "memory.limit_in_bytes", str(lim.memory_bytes))
                    if (mem / "memory.memsw.limit_in_bytes").exists():
                        _write(mem / "memory.memsw.limit_in_bytes", str(lim.memory_bytes))
            if pids is not None and lim.pids is not None:
                _write(pids / "pids.max", max_value(lim.pids))
            if cpu is not None and lim.cpu_cores is not None:
                _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(cpu / "cpu.cfs_quota_us", str(cpu_quota_us(lim.cpu_cores)))
        else:
            if mem is not None and lim.memory_bytes is not None:
                _write(mem / "memory.max", max_value(lim.memory_bytes))
                if (mem / "memory.swap.max").exists():
                    _write(mem / "memory.swap.max", "0")
            if pids is not None and lim.pids is not None:
                _write(pids / "pids.max", max_value(lim.pids))
            if cpu is not None and lim.cpu_cores is not None:
                _write(cpu / "cpu.max", cpu_max_value(lim.cpu_cores))

    def join_in_child(self) -> None:
        """Move the calling process into the cgroup(s). For a preexec_fn (after fork, before exec):
        only os.open/write/close on paths prepared in advance; an error aborts the exec."""
        for path in self._procs_files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")  # "0": the writing process itself
            finally:
                os.close(fd)

    def pids(self) -> list[int]:
        """Every process in the cgroup(s)."""
        found: set[int] = set()
        for d in self.dirs:
            found.update(_read_pids(d / "cgroup.procs"))
        return sorted(found)

    # -- killing -------------------------------------------------------------------------------
    def _freeze(self, frozen: bool, deadline: float) -> bool:
        """Freeze (or thaw) so nothing forks or exits while we list and signal; True when done."""
        if self.layout.version == "v1":
            d = self._dirs.get("freezer")
            if d is None:
                return False
            _write(d / "freezer.state", "FROZEN" if frozen else "THAWED")
            if not frozen:
                return True
            while _read(d / "freezer.state").strip() != "FROZEN":
                if time.monotonic() > deadline:
                    return False  # a task in uninterruptible sleep; kill what we can anyway
                time.sleep(0.005)
            return True
        d = self.dirs[0]
        if not (d / "cgroup.freeze").exists():
            return False
        _write(d / "cgroup.freeze", "1" if frozen else "0")
        while frozen and parse_keyed(_read(d / "cgroup.events")).get("frozen") != 1:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def _signal_members(self) -> set[int]:
        """SIGKILL each listed process through a pidfd opened while it was still listed, so a pid
        reused by a process outside the rollout is never signalled."""
        fds: dict[int, int | None] = {}
        for pid in self.pids():
            try:
                fds[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            except OSError:
                fds[pid] = None  # no pidfd support: a plain kill (safe while frozen)
        sent = set()
        try:
            still = set(self.pids())
            for pid, fd in fds.items():
                if pid not in still:
                    continue
                try:
                    if fd is None:
                        os.kill(pid, signal.SIGKILL)
                    else:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                    sent.add(pid)
                except ProcessLookupError:
                    pass
        finally:
            for fd in fds.values():
                if fd is not None:
                    os.close(fd)
        return sent

    def kill_all(self, timeout: float = 5.0) -> int:
        """SIGKILL every process until the cgroup is empty; returns how many were killed. v2 uses
        cgroup.kill (atomic, 5.14+); otherwise the cgroup is frozen during each sweep so that a
        fork bomb cannot outrun it."""
        deadline = time.monotonic() + timeout
        killed: set[int] = set()
        kill_file = self.dirs[0] / "cgroup.kill" if self.layout.version == "v2" and self.use_cgroup_kill else None
        while True:
            pids = self.pids()
            if not pids:
                return len(killed)
            if time.monotonic() > deadline:
                self.notes.append(
                    f"cgroup {self.name}: {len(pids)} process(es) still alive {timeout:g}s after SIGKILL "
                    f"(pids {' '.join(map(str, pids[:10]))})"
                )
                return len(killed)
            if kill_file is not None and kill_file.exists():
                _write(kill_file, "1")
                killed.update(pids)
            else:
                try:
                    self._freeze(True, min(deadline, time.monotonic() + 1.0))
                    killed |= self._signal_members()
                finally:
                    self._freeze(False, deadline)
            time.sleep(0.005)  # SIGKILLed tasks leave cgroup.procs when they finish exiting

    # -- reading back ----------------------------------------------------------------------------
    def usage(self) -> CgroupUsage:
        """Peak memory, OOM kills and limit events so far (after remove(): as they were then).
        Raises OSError if the files cannot be read."""
        if self._final_usage is not None:
            return self._final_usage
        mem, pids = self._dirs.get("memory"), self._dirs.get("pids")
        peak: int | None = None
        oom_kills = 0
        mem_hit = False
        pid_events = 0
        if mem is not None:
            if self.layout.version == "v1":
                peak = int(_read(mem / "memory.max_usage_in_bytes"))
                oom_kills = parse_keyed(_read(mem / "memory.oom_control")).get("oom_kill", 0)
                fail = int(_read(mem / "memory.failcnt"))
                if (mem / "memory.memsw.failcnt").exists():
                    fail += int(_read(mem / "memory.memsw.failcnt"))
                mem_hit = fail > 0 or oom_kills > 0
            else:
                if (mem / "memory.peak").exists():
                    peak = int(_read(mem / "memory.peak"))
                events = parse_keyed(_read(mem / "memory.events"))
                oom_kills = events.get("oom_kill", 0)
                mem_hit = events.get("max", 0) > 0 or events.get("oom", 0) > 0
        if pids is not None:
            pid_events = parse_keyed(_read(pids / "pids.events")).get("max", 0)
        return CgroupUsage(peak, oom_kills, mem_hit, pid_events > 0, pid_events)

    def limit_notes(self) -> list[str]:
        """Which limits the rollout hit, as sentences for the result ([] if none or unreadable)."""
        try:
            return limit_notes_for(self.limits, self.usage())
        except OSError:
            return []

    # -- removal ---------------------------------------------------------------------------------
    def remove(self, timeout: float = 5.0) -> None:
        """Kill everything, then remove the directories. Never raises; what failed goes to
        `notes`. Calling it again retries only what is left."""
        if self._removed:
            return
        deadline = time.monotonic() + timeout
        try:
            self.kill_all(timeout)
        except OSError as e:
            self.notes.append(f"cgroup {self.name}: kill failed: {e}")
        try:
            self._final_usage = self.usage()
        except (OSError, ValueError):
            pass  # already gone (a second call) or unreadable: limit_notes() then reports nothing
        left = []
        for d in self.dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    # EBUSY: a task is still exiting (or, in v2, charges are being moved); retry
                    if e.errno == errno.EBUSY and time.monotonic() < deadline:
                        time.sleep(0.01)
                        continue
                    left.append(f"{d} ({e.strerror})")
                    break
        if left:
            self.notes.append(f"cgroup {self.name}: could not remove {', '.join(left)}")
            return
        self._removed = True
        with _PARENT_LOCK:
            _rmdir_parents(self.layout)


def _attach(layout: _Layout, owner: str, name: str) -> RolloutCgroup:
    """A RolloutCgroup for an existing directory (a leftover), with unknown limits."""
    dirs = {c: p / owner / name for c, p in layout.parents.items() if (p / owner / name).is_dir()}
    return RolloutCgroup(layout, name, ResourceLimits(None, None, None), dirs)


def sweep_stale(prefix: str = "rollout-") -> list[str]:
    """Kill and remove the rollout cgroups of servers that are no longer running (call at server
    start). The cgroups of live servers, this one included, are left alone. Never raises; returns
    one sentence per cgroup removed or left."""
    layout, _ = _detect()
    return [] if layout is None else _sweep(layout, prefix)


def _sweep(layout: _Layout, prefix: str) -> list[str]:
    notes: list[str] = []
    owners: set[str] = set()
    for parent in layout.dirs:
        try:
            owners.update(e.name for e in os.scandir(parent) if e.is_dir())
        except OSError:
            continue
    for owner in sorted(owners):
        if owner == _owner_name() or _owner_alive(owner):
            continue
        names: set[str] = set()
        for parent in layout.dirs:
            try:
                names.update(e.name for e in os.scandir(parent / owner) if e.is_dir() and e.name.startswith(prefix))
            except OSError:
                continue
        for name in sorted(names):
            cg = _attach(layout, owner, name)
            try:
                killed = cg.kill_all()
            except OSError as e:
                killed = 0
                cg.notes.append(f"cgroup {name}: kill failed: {e}")
            for d in cg.dirs:
                try:
                    d.rmdir()
                except OSError as e:
                    cg.notes.append(f"cgroup {name}: could not remove {d} ({e.strerror})")
            notes.extend(cg.notes or [f"removed stale cgroup {owner}/{name} ({killed} process(es) killed)"])
        with _PARENT_LOCK:
            for parent in layout.dirs:
                try:
                    (parent / owner).rmdir()
                except OSError:
                    pass
    return notes
