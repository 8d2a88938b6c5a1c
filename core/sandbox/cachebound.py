"""The bound of a cache of directories (task images, setup layers): entries older than an age are
removed, then the least recently used until the rest fit a size; an entry in use is never removed.
An entry's modification time is its last use (its cache touches it on every hit)."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from harness_env.core.sandbox import safefs

MIB = 1024**2


@dataclass(frozen=True)
class CacheBound:
    max_bytes: int  # 0: no size bound
    max_age_s: float  # 0: no age bound

    @classmethod
    def from_env(cls, size_var: str, age_var: str, default_mb: int, default_age_s: float, env: dict[str, str] | None = None) -> CacheBound:
        """The bound the server's environment sets (MiB and seconds), else the defaults; a value
        that is not a number >= 0 is one clear error naming the variable."""
        env = os.environ if env is None else env
        values = []
        for var, default in ((size_var, float(default_mb)), (age_var, default_age_s)):
            raw = env.get(var) or ""
            try:
                value = float(raw) if raw else default
            except ValueError:
                value = -1.0
            if not value >= 0:
                raise ValueError(f"${var}={raw!r} is not a number >= 0; fix the server's environment")
            values.append(value)
        return cls(int(values[0] * MIB), values[1])


def tree_bytes(path: Path) -> int:
    """Disk blocks under `path` in bytes; links are not followed."""
    total = 0
    for parent, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_blocks * 512
            except OSError:
                pass
    return total


def evict(root: Path, bound: CacheBound, in_use: Collection[str], now: float, entry: Callable[[str], bool]) -> list[str]:
    """Remove entries of `root` (the names `entry` accepts) past the bound, oldest use first,
    never one named in `in_use`; the names removed. Never raises."""
    found = []
    try:
        with os.scandir(root) as it:
            for e in it:
                if entry(e.name) and e.is_dir(follow_symlinks=False):
                    found.append((e.stat(follow_symlinks=False).st_mtime, e.name))
    except OSError:
        return []
    found.sort()
    sizes = {name: tree_bytes(root / name) for _, name in found} if bound.max_bytes else {}
    total = sum(sizes.values())
    removed = []
    for used, name in found:
        too_old = bound.max_age_s and now - used > bound.max_age_s
        too_big = bound.max_bytes and total > bound.max_bytes
        if not (too_old or too_big) or name in in_use:
            continue
        if safefs.remove_tree(root / name) is None:
            removed.append(name)
            total -= sizes.get(name, 0)
    return removed
