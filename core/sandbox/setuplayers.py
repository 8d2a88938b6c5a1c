"""One setup per group: rollouts that share the harness, the image (by digest), the task files, the
setup commands and the sandbox settings (a GRPO group, an eval's attempts) run setup once.

The first member runs it; what it left (the rollout's own directories: workspace, home, tmp, XDG,
logs; with a task image, its writable layer too) is copied into a layer of this server's cache,
and each later member's sandbox starts from that layer (setupfork.py): its directories are
overlays with the layer read-only below and the member's own writes above, or, where this host
cannot mount overlays, copies of it (`cp -a`, with reflinks where the file system has them).
Either way a member's writes stay in its own directory, never seen by another, and verify runs
on the member's own files only. A setup that fails is not cached; the members that waited for it
end with the same `setup` failure, and later ones try again.

A file setup wrote may name the directory it ran in (a venv's scripts name their interpreter by its
path): under bubblewrap that path is a link to the member's own directory inside its sandbox.

The cache belongs to one server process: a leased directory beside the image cache, removed when
the process exits and swept at the next start when it was killed. It is bounded in size and age
(HARNESS_ENV_SETUP_CACHE_MB, 0 turns sharing off; HARNESS_ENV_SETUP_CACHE_AGE_S); a layer a member
is being made from, or that a member's overlay still has below it, is never evicted.

Where the server can mount one (root), the cache is a tmpfs of its own: saving a layer is then a
copy from memory to memory (a venv: about a fifth of the time onto ext4), which every member waits
for. Its size is twice the bound, so a save can finish before eviction brings the cache back
within it; a save that finds it full fails, and the members run their own setup.
HARNESS_ENV_SETUP_CACHE_MEMORY=0 keeps it on disk.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness_env.core.errors import SandboxError
from harness_env.core.sandbox.cachebound import CacheBound, evict
from harness_env.core.sandbox.host import entries_below_overlays, mount_tmpfs
from harness_env.core.sandbox.images import image_cache_root
from harness_env.core.sandbox.lease import TEMP_DIR_PREFIX, remove_leased, write_lease

SIZE_VAR, AGE_VAR = "HARNESS_ENV_SETUP_CACHE_MB", "HARNESS_ENV_SETUP_CACHE_AGE_S"
MEMORY_VAR = "HARNESS_ENV_SETUP_CACHE_MEMORY"  # "0": the cache stays on disk where a tmpfs could hold it
DEFAULT_MB, DEFAULT_AGE_S = 4096, 3600.0
COPY_TIMEOUT_S = 1800.0
META = "layer.json"
UPPER = "upper"  # an image rollout's writable layer, beside the copies of its directories


@dataclass(frozen=True)
class SetupLayer:
    """A saved setup: where its files are, the directory setup ran in, and what setup printed."""

    path: Path
    ran_in: str  # the first member's rollout directory, as its files may name it
    results: list[dict[str, Any]]


def copy_tree(src: Path, dest: Path) -> None:
    """`src`'s contents into the existing directory `dest`, owners, modes, links, device nodes (an
    overlay's whiteouts) and extended attributes kept."""
    proc = subprocess.run(["cp", "-a", "--reflink=auto", "--", f"{src}/.", f"{dest}/"], capture_output=True, text=True, timeout=COPY_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise SandboxError(f"could not copy the group's setup layer: {proc.stderr.strip()[-300:]}")


def mounted_layers(root: Path) -> set[str]:
    """Names of the layers in `root` that a live overlay has below it (a member's: setupfork.py)."""
    return entries_below_overlays(root)


class SetupLayers:
    """This process's cache of setup layers (blocking methods: call them off the event loop)."""

    def __init__(self, bound: CacheBound) -> None:
        self.bound = bound
        self._dir: Path | None = None
        self._guard = threading.RLock()
        self._in_use: dict[str, int] = {}  # layer name -> sandboxes being made from it
        self.in_memory = False  # the cache is a tmpfs of its own (known once it is made)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> SetupLayers | None:
        """The cache the server's settings ask for; None when sharing is off (a size of 0)."""
        bound = CacheBound.from_env(SIZE_VAR, AGE_VAR, DEFAULT_MB, DEFAULT_AGE_S, env)
        return cls(bound) if bound.max_bytes else None

    def _root(self) -> Path:
        with self._guard:
            if self._dir is None:
                parent = image_cache_root()
                parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                path = parent / f"{TEMP_DIR_PREFIX}setups-{uuid.uuid4().hex[:12]}"
                write_lease(path)  # a killed server's layers are swept at the next start
                path.mkdir(mode=0o700)
                atexit.register(remove_leased, path)  # unmounts the tmpfs first
                self.in_memory = os.environ.get(MEMORY_VAR, "").strip() != "0" and mount_tmpfs(path, 2 * self.bound.max_bytes, mode=0o700)
                self._dir = path
            return self._dir

    def find(self, key: str) -> SetupLayer | None:
        path = self._root() / key
        try:
            meta = json.loads((path / META).read_text())
        except (OSError, ValueError):
            return None
        os.utime(path)  # used: the last to be evicted
        return SetupLayer(path, meta["ran_in"], meta["results"])

    def save(self, key: str, rollout_dir: Path, dirs: tuple[str, ...], upper: Path | None, results: list[dict[str, Any]]) -> SetupLayer:
        """Copy what setup left below `rollout_dir` (`dirs`, and an image's writable layer `upper`)
        into the layer of `key`; complete or absent, never half-written."""
        root = self._root()
        tmp = root / f"{TEMP_DIR_PREFIX}{uuid.uuid4().hex[:12]}"
        try:
            tmp.mkdir(mode=0o700)
            for d in dirs:
                (tmp / d).mkdir(parents=True)
                copy_tree(rollout_dir / d, tmp / d)
            if upper is not None:
                (tmp / UPPER).mkdir()
                copy_tree(upper, tmp / UPPER)
            (tmp / META).write_text(json.dumps({"ran_in": str(rollout_dir), "results": results}))
            os.rename(tmp, root / key)
        except OSError as e:
            raise SandboxError(f"could not save the group's setup layer: {e.strerror or e}") from e
        finally:
            if tmp.exists():
                remove_leased(tmp)
        self.evict()
        return SetupLayer(root / key, str(rollout_dir), results)

    def hold(self, layer: SetupLayer) -> bool:
        """Keep `layer` from eviction while a sandbox is made from it; False when it is gone already."""
        with self._guard:
            if not (layer.path / META).is_file():
                return False
            self._in_use[layer.path.name] = self._in_use.get(layer.path.name, 0) + 1
            return True

    def release(self, layer: SetupLayer) -> None:
        with self._guard:
            left = self._in_use.get(layer.path.name, 1) - 1
            if left:
                self._in_use[layer.path.name] = left
            else:
                self._in_use.pop(layer.path.name, None)

    def evict(self, now: float | None = None) -> list[str]:
        with self._guard:  # held throughout: no layer is taken while the cache is bounded
            root = self._root()
            in_use = set(self._in_use) | mounted_layers(root)
            return evict(root, self.bound, in_use, time.time() if now is None else now, entry=lambda name: len(name) == 64)


@functools.cache
def process_setup_layers() -> SetupLayers | None:
    """This process's cache, as its environment sets it (made on first use)."""
    return SetupLayers.from_env()
