"""What a killed owner left: every `run` and `eval`, and every start of the app (`serve`, OpenEnv's
`harness_env.server.app:app`, each Ray replica) sweeps at start what dead owners left.

A process killed with SIGKILL cannot clean up after itself: its rollouts' tmpfs mounts, directories,
cgroups and its capture socket stay. At start, for every rollout lease (lease.py) in the sandbox
directory that is stale, the rollout's processes are killed (those carrying its marker variable;
cgroups of dead servers are killed and removed by cgroups.sweep_stale), every mount at or below its
directory is detached, the directory is removed without following a link, then the lease. A live
owner's rollouts (another server or run sharing the directory) are never touched, and nothing
outside the sandbox directory is: entries are matched by name, a link is removed, not followed,
and a directory is removed only once nothing is mounted below it.

This module is the local backend's sweep (registered with it: core/sandbox/backends.py), knowing
its layout: `rollout-<id>` directories and those of a harness that makes its own in the sandbox
directory (`Harness.leased_dir_prefixes`, e.g. Harbor's trials), its cgroups and its image pulls.
`sweep_at_start` adds what is no backend's (leased temporary directories, capture sockets) to every
registered backend's sweep.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

from harness_env.core.capture.sockets import sweep_sockets
from harness_env.core.procs import kill_process
from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.cgroups import sweep_stale
from harness_env.core.sandbox.host import sandboxes_root, unmount_tree
from harness_env.core.sandbox.images import image_cache_root
from harness_env.core.sandbox.lease import (
    LEASE_SUFFIX,
    PREFIX_RE,
    ROLLOUT_PREFIX,
    TEMP_DIR_PREFIX,
    is_stale,
    leased_name_re,
    read_lease,
    remove_leased,
    unreadable_is_stale,
)
from harness_env.core.sandbox.processes import marked_pids


def local_dir_prefixes() -> list[str]:
    """The names the local backend's leased directories in the sandbox directory start with: its
    rollouts', and those the registered harnesses declare they make there themselves (a prefix
    not of lease.PREFIX_RE's form is ignored: it names no directory a sweep may touch)."""
    from harness_env.core.registry import HARNESSES

    declared = {p for cls in HARNESSES.values() for p in getattr(cls, "leased_dir_prefixes", ()) if isinstance(p, str) and PREFIX_RE.fullmatch(p)}
    return [ROLLOUT_PREFIX, *sorted(declared - {ROLLOUT_PREFIX})]


def _stale_rollouts(root: Path, now: float, pattern: re.Pattern[str]) -> list[str]:
    """Names of the rollouts in `root` whose lease is stale, or cannot be read and is older than
    any lease (a lease being written, or one this version cannot parse, is a live owner's)."""
    names = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        name = entry.name.removesuffix(LEASE_SUFFIX)
        if not entry.name.endswith(LEASE_SUFFIX) or not pattern.fullmatch(name):
            continue
        lease = read_lease(Path(entry.path))
        if lease is None:
            try:
                if not unreadable_is_stale(entry.stat(follow_symlinks=False).st_mtime, now):
                    continue
            except OSError:
                continue
        elif not is_stale(lease, now):
            continue
        names.append(name)
    return names


def _kill_marked(name: str, rounds: int = 50) -> int:
    """SIGKILL every process carrying rollout `name`'s marker until none is left; how many."""
    killed = 0
    for _ in range(rounds):
        pids = marked_pids(name)
        if not pids:
            break
        for pid in pids:
            kill_process(pid)
        killed += len(pids)
        time.sleep(0.05)
    return killed


def _clear(root: Path, name: str) -> tuple[int, str | None]:
    """Kill, unmount and remove what rollout `name` left in `root`, then its lease: (processes
    killed, what is left or None). The lease stays while anything is left, for the next sweep."""
    rollout = Path(os.path.realpath(root)) / name  # /proc/self/mounts names real paths
    killed = _kill_marked(name)
    problem = unmount_tree(rollout) or safefs.remove_tree(rollout)
    if problem:
        return killed, problem
    try:
        os.unlink(root / (name + LEASE_SUFFIX))
    except FileNotFoundError:
        pass  # another start swept it at the same time
    except OSError as e:
        return killed, f"could not remove its lease: {e.strerror}"
    return killed, None


def sweep_rollout(root: Path, name: str) -> str:
    """Clear rollout `name` of a dead owner in `root`: one sentence saying what was done or left."""
    killed, problem = _clear(root, name)
    if problem:
        return f"rollout {name} of a dead owner: {problem}; left for the next start"
    return f"removed rollout {name} of a dead owner ({killed} process(es) killed)"


def remove_rollout(path: str) -> str | None:
    """The local backend's `remove`: a dead server's rollout directory `path` (the job store
    knows the server died; its lease may not tell from here). None when `path` is not a local
    rollout directory."""
    root = Path(path)
    if not leased_name_re(local_dir_prefixes()).fullmatch(root.name):
        return None
    _, problem = _clear(root.parent, root.name)
    return problem or "sandbox directory removed"


def sweep_sandboxes(root: Path | None = None, prefixes: list[str] | None = None) -> list[str]:
    """Sweep every rollout of `root` (default: the sandbox directory) whose owner is dead or whose
    lease expired (`prefixes`: its directories' names, default local_dir_prefixes()). Never
    raises; one sentence per rollout."""
    root = root or sandboxes_root()
    pattern = leased_name_re(local_dir_prefixes() if prefixes is None else prefixes)
    return [sweep_rollout(root, name) for name in _stale_rollouts(root, time.time(), pattern)]


def sweep_temp_dirs(parent: Path | None = None) -> list[str]:
    """Remove the leased temporary directories (lease.leased_temp_dir: e.g. the web UI's Gradio
    cache) of dead owners in `parent` (default: the system's temporary directory). Only a real
    directory whose lease is stale is touched. Never raises; one sentence per directory."""
    parent = parent or Path(tempfile.gettempdir())
    notes = []
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(TEMP_DIR_PREFIX) and e.name.endswith(LEASE_SUFFIX)]
    except OSError:
        return []
    for entry in entries:
        path = parent / entry.name.removesuffix(LEASE_SUFFIX)
        lease = read_lease(Path(entry.path))
        if lease is None or not is_stale(lease) or not path.is_dir() or path.is_symlink():
            continue
        problem = remove_leased(path)
        notes.append(f"removed {path} of a dead process" if problem is None else f"{path} of a dead process: {problem}")
    return notes


def sweep_local() -> list[str]:
    """The local backend's sweep: the cgroups of dead servers, the rollouts of dead owners in the
    sandbox directory, and image pulls they left."""
    notes = list(sweep_stale())
    notes += sweep_sandboxes()
    notes += sweep_temp_dirs(image_cache_root())  # a pull a killed server left half-done (images.py)
    return notes


def sweep_at_start() -> list[str]:
    """What every `run` and `eval`, and the app's lifespan, do first: every registered sandbox
    backend's sweep (core/sandbox/backends.py), dead owners' leased temporary directories and
    capture sockets (core/capture/sockets.py). Blocking: call it off the event loop. Never raises."""
    from harness_env.core.sandbox.backends import sweep_backends

    notes = sweep_backends()
    notes += sweep_temp_dirs()
    notes += [f"removed the capture socket {path} of a dead process" for path in sweep_sockets()]
    return notes
