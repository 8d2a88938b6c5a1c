"""What the suite left behind, for conftest.py's end-of-session check: rollout mounts under
pytest's temporary base and in the default sandbox directory (sandboxes_root() as the session
found it, e.g. /tmp/harness-env, where a command started without the tests' variables puts its
rollouts), and entries of that directory. Only what appeared during the session and is no live
stranger's (another run or suite sharing the machine) counts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness_env.core.capture.sockets import sweep_sockets
from harness_env.core.sandbox.cgroups import sweep_stale
from harness_env.core.sandbox.host import mounts_at_or_below, unmount_tree
from harness_env.core.sandbox.lease import LEASE_SUFFIX, leased_name_re, owner_alive, read_lease
from harness_env.core.sandbox.sweep import local_dir_prefixes, sweep_sandboxes


def _rollout_mounts(*tops: Path) -> set[str]:
    """Mounts with a rollout directory (`rollout-<id>`, `trial-<id>`) on their path, at or below `tops`."""
    names = leased_name_re(local_dir_prefixes())
    return {m for top in tops for m in mounts_at_or_below(top) if any(names.fullmatch(p) for p in Path(m).parts)}


def _entries(root: Path) -> set[str]:
    try:
        return set(os.listdir(root))
    except OSError:
        return set()


@dataclass(frozen=True)
class Before:
    """What was there when the session started."""

    base: Path
    default_root: Path
    mounted: frozenset[str]
    in_default: frozenset[str]

    @classmethod
    def take(cls, base: Path, default_root: Path) -> Before:
        base, default_root = base.resolve(), Path(os.path.realpath(default_root))
        return cls(base, default_root, frozenset(_rollout_mounts(base, default_root)), frozenset(_entries(default_root)))

    def _ours(self, name: str) -> bool:
        """Whether rollout entry `name` of the default root is this suite's: anything but the
        rollout of a live process other than pytest itself."""
        lease = read_lease(self.default_root / (name.removesuffix(LEASE_SUFFIX) + LEASE_SUFFIX))
        return lease is None or lease.pid == os.getpid() or owner_alive(lease) is not True

    def _mount_ours(self, mount: str) -> bool:
        path = Path(mount)
        return not path.is_relative_to(self.default_root) or self._ours(path.relative_to(self.default_root).parts[0])

    def left_mounted(self) -> list[str]:
        return sorted(m for m in _rollout_mounts(self.base, self.default_root) - self.mounted if self._mount_ours(m))

    def left_in_default_root(self) -> list[str]:
        return sorted(n for n in _entries(self.default_root) - self.in_default if self._ours(n))

    def sweep(self, mounted: list[str]) -> list[str]:
        """Clean up what a check found (dead owners' rollouts, the base's mounts, dead servers'
        cgroups and sockets), so the machine is clean even when the suite fails; what was done."""
        parents = {Path(m).parent for m in mounted if not Path(m).is_relative_to(self.default_root)}
        swept = [note for parent in sorted(parents) for note in sweep_sandboxes(parent)]
        swept += sweep_sandboxes(self.default_root)  # dead owners' only: never a live stranger's
        unmount_tree(self.base)  # anything else of the suite's, e.g. a rollout whose owner still runs
        swept += sweep_stale()  # the cgroups of the suite's killed servers and runs
        return swept + [f"removed {path}" for path in sweep_sockets()]
