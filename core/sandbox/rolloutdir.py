"""A local rollout's directory, made: leased, on a size-limited tmpfs where the machine allows
one, its agent directories owned by the sandbox's uid, a task image's overlay root mounted, and
(for a member of a group) what the group's setup left copied in, or its image layer stacked below
(setuplayers.py, setupfork.py). All or nothing:
a failure removes what was made and raises SandboxError."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from harness_env.core.errors import SandboxError
from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.cgroups import RolloutCgroup
from harness_env.core.sandbox.host import mount_tmpfs, unmount_tree
from harness_env.core.sandbox.imageroot import LAYER_DIR, mount_image_root, seed_workspace
from harness_env.core.sandbox.images import TaskImage
from harness_env.core.sandbox.lease import lease_path, write_lease
from harness_env.core.sandbox.limits import Limits
from harness_env.core.sandbox.setuplayers import UPPER, SetupLayer, copy_tree

AGENT_DIRS = ("workspace", "home", "tmp", "xdg", "logs")  # what commands may write
XDG_DIRS = ("xdg/config", "xdg/cache", "xdg/data", "xdg/state")  # under a home root: the rollout's, verify's


@dataclass
class RolloutDir:
    root: Path
    tmpfs: bool
    binds: dict[str, str]  # inside path -> host directory below root
    image_root: str | None  # the merged root of the task image's overlay
    cgroup: RolloutCgroup | None


def make_rollout_dir(
    base: Path,
    limits: Limits,
    run_as: tuple[int, int] | None,
    extra_binds: dict[str, str] | None,
    task_image: TaskImage | None,
    setup_layer: SetupLayer | None,
    by_overlay: bool = False,
) -> RolloutDir:
    """`setup_layer`: a group's, copied in; `by_overlay`: its agent directories are mounted later
    (setupfork.py) and an image's saved layer is stacked below the rollout's own, not copied."""
    root = base / f"rollout-{uuid.uuid4().hex[:12]}"
    tmpfs = leased = False
    try:
        base.mkdir(parents=True, exist_ok=True)
        write_lease(root)  # before the directory: none of ours is ever without its owner's name
        leased = True
        root.mkdir(mode=0o755)
        if limits.disk_bytes:
            tmpfs = mount_tmpfs(root, limits.disk_bytes)
        os.chmod(root, 0o755)  # the server's: the agent can neither rename nor add entries here
        (root / "verifier").mkdir()  # the server's until verify starts
        for sub in (*AGENT_DIRS, *XDG_DIRS):
            (root / sub).mkdir(exist_ok=True)
            if run_as is not None:
                os.chown(root / sub, *run_as)
        binds = {}
        for inside, rel in (extra_binds or {}).items():
            (root / rel).mkdir(parents=True, exist_ok=True)
            binds[inside] = str(root / rel)
        if setup_layer is not None and not by_overlay:  # the group's setup, then its image layer before the overlay is mounted
            for sub in AGENT_DIRS:
                copy_tree(setup_layer.path / sub, root / sub)
        seed = setup_layer.path / UPPER if setup_layer is not None and task_image is not None else None
        image_root = mount_image_root(task_image, root, tmpfs, seed, by_overlay) if task_image is not None else None
        if task_image is not None and task_image.workdir is not None and setup_layer is None:
            seed_workspace(task_image, root / "workspace", run_as)
        cgroup = RolloutCgroup.create(root.name, limits.cgroup_limits())
    except (OSError, SandboxError) as e:
        if not (unmount_tree(root) or safefs.remove_tree(root)) and leased:
            lease_path(root).unlink(missing_ok=True)
        if isinstance(e, SandboxError):
            raise
        raise SandboxError(f"could not create the sandbox directory under {base}: {e}") from e
    return RolloutDir(root, tmpfs, binds, image_root, cgroup)


def image_upper(root: Path) -> Path:
    """Where a task image's writable layer of the rollout at `root` is."""
    return root / LAYER_DIR / "upper"
