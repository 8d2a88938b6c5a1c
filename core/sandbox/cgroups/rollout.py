"""One rollout's cgroup(s): limits, membership, usage, killing everything in it, and removal.

Commands join through their entry shell before they exec (core/sandbox/limits.py), so the
harness is limited from its first instruction and everything it forks inherits the cgroup;
`kill_all` empties it even against a fork bomb (cgroup.kill, or freezing while signalling).
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from pathlib import Path

from harness_env.core.errors import SandboxError
from harness_env.core.sandbox.cgroups.layout import Layout, detect, make_rollout_dirs, read_pids, read_text, remove_parents, write_value
from harness_env.core.sandbox.cgroups.values import (
    CPU_PERIOD_US,
    CgroupUsage,
    ResourceLimits,
    cpu_max_value,
    cpu_quota_us,
    limit_notes_for,
    max_value,
    parse_keyed,
)

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class RolloutCgroup:
    """One rollout's cgroup(s): limits, membership, usage, kill and removal."""

    use_cgroup_kill = True  # v2: cgroup.kill where the kernel has it (tests turn it off for the freeze path)

    def __init__(self, layout: Layout, name: str, limits: ResourceLimits, dirs: dict[str, Path]) -> None:
        self.layout = layout
        self.name = name
        self.limits = limits
        self._dirs = dirs  # controller -> this rollout's dir in its hierarchy
        self.dirs = list(dict.fromkeys(dirs.values()))
        # What a command's entry shell writes its pid to, before it execs (core/sandbox/limits.py).
        self.procs_files = [str(d / "cgroup.procs") for d in self.dirs]
        self.notes: list[str] = []  # what kill_all/remove could not do
        self._removed = False
        self._final_usage: CgroupUsage | None = None  # read just before removal, for the result

    @classmethod
    def create(cls, name: str, limits: ResourceLimits) -> RolloutCgroup | None:
        """The cgroup for sandbox `name` with `limits`, or None where cgroups are unsupported."""
        layout, _ = detect()
        if layout is None:
            return None
        return cls.create_in(layout, name, limits)

    @classmethod
    def create_in(cls, layout: Layout, name: str, limits: ResourceLimits) -> RolloutCgroup:
        """The cgroup for sandbox `name` in `layout` (tests pass a layout of their own)."""
        if not _NAME_RE.fullmatch(name):
            raise SandboxError(f"invalid cgroup name {name!r}: use letters, digits, '_', '.', '-'")
        if limits.cpu_cores is not None and "cpu" not in layout.parents:
            raise SandboxError("a cpu limit was asked for but the cpu cgroup controller is not available here; leave cpu_cores unset")
        made = make_rollout_dirs(layout, name)
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
                write_value(mem / "memory.oom_control", "0")  # the OOM killer acts (rather than pausing)
                if lim.memory_bytes is not None:
                    # limit first: memsw must never be below it. memsw: swap cannot extend the limit.
                    write_value(mem / "memory.limit_in_bytes", str(lim.memory_bytes))
                    if (mem / "memory.memsw.limit_in_bytes").exists():
                        write_value(mem / "memory.memsw.limit_in_bytes", str(lim.memory_bytes))
            if pids is not None and lim.pids is not None:
                write_value(pids / "pids.max", max_value(lim.pids))
            if cpu is not None and lim.cpu_cores is not None:
                write_value(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                write_value(cpu / "cpu.cfs_quota_us", str(cpu_quota_us(lim.cpu_cores)))
        else:
            if mem is not None and lim.memory_bytes is not None:
                write_value(mem / "memory.max", max_value(lim.memory_bytes))
                if (mem / "memory.swap.max").exists():
                    write_value(mem / "memory.swap.max", "0")
            if pids is not None and lim.pids is not None:
                write_value(pids / "pids.max", max_value(lim.pids))
            if cpu is not None and lim.cpu_cores is not None:
                write_value(cpu / "cpu.max", cpu_max_value(lim.cpu_cores))

    def pids(self) -> list[int]:
        """Every process in the cgroup(s)."""
        found: set[int] = set()
        for d in self.dirs:
            found.update(read_pids(d / "cgroup.procs"))
        return sorted(found)

    # -- killing -------------------------------------------------------------------------------
    def _freeze(self, frozen: bool, deadline: float) -> bool:
        """Freeze (or thaw) so nothing forks or exits while we list and signal; True when done."""
        if self.layout.version == "v1":
            d = self._dirs.get("freezer")
            if d is None:
                return False
            write_value(d / "freezer.state", "FROZEN" if frozen else "THAWED")
            if not frozen:
                return True
            while read_text(d / "freezer.state").strip() != "FROZEN":
                if time.monotonic() > deadline:
                    return False  # a task in uninterruptible sleep; kill what we can anyway
                time.sleep(0.005)
            return True
        d = self.dirs[0]
        if not (d / "cgroup.freeze").exists():
            return False
        write_value(d / "cgroup.freeze", "1" if frozen else "0")
        while frozen and parse_keyed(read_text(d / "cgroup.events")).get("frozen") != 1:
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
                self.notes.append(f"cgroup {self.name}: {len(pids)} process(es) still alive {timeout:g}s after SIGKILL (pids {' '.join(map(str, pids[:10]))})")
                return len(killed)
            if kill_file is not None and kill_file.exists():
                write_value(kill_file, "1")
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
                peak = int(read_text(mem / "memory.max_usage_in_bytes"))
                oom_kills = parse_keyed(read_text(mem / "memory.oom_control")).get("oom_kill", 0)
                fail = int(read_text(mem / "memory.failcnt"))
                if (mem / "memory.memsw.failcnt").exists():
                    fail += int(read_text(mem / "memory.memsw.failcnt"))
                mem_hit = fail > 0 or oom_kills > 0
            else:
                if (mem / "memory.peak").exists():
                    peak = int(read_text(mem / "memory.peak"))
                events = parse_keyed(read_text(mem / "memory.events"))
                oom_kills = events.get("oom_kill", 0)
                mem_hit = events.get("max", 0) > 0 or events.get("oom", 0) > 0
        if pids is not None:
            pid_events = parse_keyed(read_text(pids / "pids.events")).get("max", 0)
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
        remove_parents(self.layout)
