"""A group member's start from the group's saved setup (setuplayers.py) without copying it: each of
the member's agent directories (workspace, home, tmp, xdg, logs) is an overlay with that directory
of the saved layer read-only below and an upper and work directory of the member's own above, in
FORK_DIR below its rollout directory (on its tmpfs where it has one: the disk limit counts what it
writes). A member starts in the time of five mounts, however much setup left; a file setup made is
copied up only when the member writes it. The layer itself is never written (the kernel writes only
upper directories): no member sees another's files, and the saved setup stays what setup left.

The overlays are mounts below the rollout directory, so they go where its tmpfs goes: close() and
the sweep of a killed owner's rollouts (sweep.py) detach every mount below the directory before
removing it (host.unmount_tree); a layer some member's overlay still names is never evicted.

Where overlays cannot be mounted (a server that is not root, a kernel without overlayfs, or
HARNESS_ENV_SETUP_OVERLAY=0), each member copies the layer (`cp -a`) as before. The host's answer
is looked up once and logged; each member's sandbox notes say which way it started, and why not by
overlay when it copied (a member whose mounts fail copies too). A task image's member stacks the
saved image layer read-only between the image and its own writable layer (imageroot.py), so it
copies nothing either; where overlays cannot be had it copies that layer into its own.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

from harness_env.core.errors import SandboxError
from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.host import mount_overlay, unmount_tree
from harness_env.core.sandbox.setuplayers import SetupLayer, copy_tree

logger = logging.getLogger(__name__)

OVERLAY_VAR = "HARNESS_ENV_SETUP_OVERLAY"  # "0": members copy the layer even where overlays work
FORK_DIR = "setup-fork"  # below a member's rollout directory, the server's (0700): upper and work per directory
BY_OVERLAY = "started from the group's setup layer by overlay (read-only below, its own writes above; nothing copied)"


@functools.cache
def host_refusal() -> str | None:
    """Why this host cannot give members overlays, or None when it can (looked up once, logged)."""
    refusal = None
    if os.geteuid() != 0:
        refusal = "the server is not root (an overlay mount needs root)"
    else:
        try:
            with open("/proc/filesystems", encoding="ascii") as f:
                kinds = {line.split()[-1] for line in f if line.strip()}
        except OSError:
            kinds = set()
        if "overlay" not in kinds:
            refusal = "this kernel has no overlayfs (modprobe overlay)"
    if refusal is None:
        logger.info("group members start from the saved setup layer by overlay mounts")
    else:
        logger.info("group members copy the saved setup layer: %s", refusal)
    return refusal


def overlay_refusal() -> str | None:
    """Why members copy here, or None: they mount. The server's setting, then the host's answer."""
    if os.environ.get(OVERLAY_VAR, "").strip() == "0":
        return f"{OVERLAY_VAR}=0"
    return host_refusal()


def fork_setup(layer: SetupLayer, root: Path, dirs: tuple[str, ...]) -> str:
    """Start the rollout at `root` (its `dirs` made, empty) from `layer`: by overlay where this host
    allows it, else by copy. The note that says which; raises SandboxError when neither works."""
    refusal = overlay_refusal()
    if refusal is None:
        refusal = mount_fork(layer, root, dirs)
        if refusal is None:
            return BY_OVERLAY
        logger.warning("rollout %s copies the group's setup layer: %s", root.name, refusal)
    for sub in dirs:
        copy_tree(layer.path / sub, root / sub)
    return copied_note(refusal)


def copied_note(refusal: str) -> str:
    """A member's note when it copied the layer, and why (a task image's member copied its image
    layer too)."""
    return f"copied the group's setup layer (no overlay: {refusal})"


def mount_fork(layer: SetupLayer, root: Path, dirs: tuple[str, ...]) -> str | None:
    """Mount each of `dirs` below `root` as an overlay on the same directory of `layer`; what went
    wrong, in words, or None. All or nothing: a failure leaves `root`'s directories as they were."""
    fork = root / FORK_DIR
    try:
        fork.mkdir(mode=0o700)
        for sub in dirs:
            problem = _mount_one(layer.path / sub, fork / sub, root / sub)
            if problem:
                raise SandboxError(problem)
    except (OSError, SandboxError) as e:
        undone = "".join(f"{p}; " for p in (*(unmount_tree(root / sub) for sub in dirs), safefs.remove_tree(fork)) if p)
        if undone:  # the directories are not what they were: the rollout cannot start from a copy either
            raise SandboxError(f"could not start from the group's setup layer: {e}; {undone}") from e
        return getattr(e, "strerror", None) or str(e)
    return None


def _mount_one(lower: Path, own: Path, target: Path) -> str | None:
    """An overlay at `target` on `lower`, its writes in `own`/upper (the merged directory takes
    the upper directory's owner and mode: those of `lower`, which setup's member had)."""
    upper, work = own / "upper", own / "work"
    for d in (own, upper, work):
        d.mkdir(mode=0o700)
    st = os.stat(lower, follow_symlinks=False)
    os.chown(upper, st.st_uid, st.st_gid)
    os.chmod(upper, st.st_mode & 0o7777)
    return mount_overlay(str(lower), upper, work, target)
