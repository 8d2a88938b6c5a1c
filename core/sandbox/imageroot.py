"""A task image (images.py) as one rollout's root: an overlay with the cached image read-only below
and a writable layer of the rollout's own above, on the rollout's tmpfs (so the disk limit counts
what the agent writes into the image, and close() or the sweep unmounts it with the rest of the
rollout directory: host.unmount_tree).

The few host programs the sandbox itself starts inside (setpriv to drop to the sandbox's uid; bash,
socat and sleep for the network forwarder) must not depend on the image: the host's system
directories are shown read-only under HOST_INSIDE and each helper runs through the host's own
dynamic loader with the host's libraries, so an image needs none of them (nor a libc that suits
them). What the helper then starts is the image's.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import struct
import subprocess
from pathlib import Path

from harness_env.core.errors import SandboxError
from harness_env.core.sandbox.host import mount_overlay, mount_tmpfs
from harness_env.core.sandbox.images import TaskImage
from harness_env.core.sandbox.setuplayers import copy_tree

logger = logging.getLogger(__name__)

HOST_INSIDE = "/run/harness-env/host"  # the host's system directories, read-only, in an image's root
HELPERS = ("setpriv", "bash", "socat", "sleep", "env")
IMAGE_PRELOAD = "/etc/ld.so.preload"  # hidden in an image's root (/dev/null over it)
LAYER_DIR = "image"  # below the rollout directory: upper, work and the merged root
NO_DISK_LIMIT_LAYER_BYTES = 4096 * 1024 * 1024  # the layer's size when the sandbox has no disk limit: disk_limit_mb's default


def mount_image_root(image: TaskImage, rollout_dir: Path, on_tmpfs: bool, seed: Path | None = None, seed_below: bool = False) -> str:
    """Mount `image` with a fresh writable layer below `rollout_dir`, on `seed` (a group's saved
    image layer) when given: stacked read-only between the image and the rollout's own layer with
    `seed_below` (nothing copied; where the kernel refuses the stack, copied after all), else copied
    into the rollout's layer. The merged root's host path."""
    layer = rollout_dir / LAYER_DIR
    layer.mkdir(mode=0o700)  # the server's: inside, only the merged root bound at / is seen
    # An upper layer cannot live on the host's overlay root; a tmpfs of size 0 would be unbounded
    # (memory): a sandbox made without a disk limit gets the option's default one here.
    if not on_tmpfs and not mount_tmpfs(layer, NO_DISK_LIMIT_LAYER_BYTES):
        raise SandboxError("a task image needs a root server (its writable layer is an overlay on a tmpfs)")
    upper, work, merged = layer / "upper", layer / "work", layer / "root"
    for d in (upper, work, merged):
        d.mkdir(mode=0o755)
    st = os.stat(image.rootfs)
    os.chmod(upper, st.st_mode & 0o7777)  # the merged root takes its upper directory's owner and mode
    os.chown(upper, st.st_uid, st.st_gid)
    if seed is not None and not seed_below:
        copy_tree(seed, upper)
    # bubblewrap makes a missing parent of what it masks (IMAGE_PRELOAD) mode 0700: an image without
    # /etc would leave its user nothing readable there (openssl.cnf, a CLI's config). A distribution's is 0755.
    etc = os.path.dirname(IMAGE_PRELOAD).lstrip("/")
    if not any(os.path.lexists(os.path.join(d, etc)) for d in (image.rootfs, upper, *([seed] if seed else []))):
        (upper / etc).mkdir()
        os.chmod(upper / etc, 0o755)  # whatever the server's umask
    problem = mount_overlay([str(seed), image.rootfs] if seed is not None and seed_below else image.rootfs, upper, work, merged)
    if problem and seed is not None and seed_below:
        logger.warning("rollout %s copies the group's saved image layer: %s", rollout_dir.name, problem)
        copy_tree(seed, upper)
        problem = mount_overlay(image.rootfs, upper, work, merged)
    if problem:
        raise SandboxError(problem)
    return str(merged)


def seed_workspace(image: TaskImage, workspace: Path, owner: tuple[int, int] | None) -> None:
    """The image's WorkingDir copied into the rollout's workspace, which is then bound at WorkingDir:
    the agent works on the image's files there, and what it leaves is collected and verified like any
    workspace. Links are copied as links, never followed (they point into the image, not the host)."""
    assert image.workdir is not None
    src = Path(os.path.realpath(image.rootfs)) / image.workdir.strip("/")
    if os.path.realpath(src) != str(src):
        raise SandboxError(f"the image's WorkingDir {image.workdir!r} goes through a link; a task image needs a real directory there")
    if not src.is_dir():
        return  # Docker makes it on first use: an empty workspace is the same
    proc = subprocess.run(["cp", "-a", "--", f"{src}/.", f"{workspace}/"], capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode == 0 and owner is not None:
        proc = subprocess.run(["chown", "-R", "-h", f"{owner[0]}:{owner[1]}", "--", str(workspace)], capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise SandboxError(f"could not copy the image's WorkingDir {image.workdir!r} into the workspace: {proc.stderr.strip()[-300:]}")


def elf_interpreter(path: str) -> str | None:
    """The program interpreter (dynamic loader) a 64-bit little-endian ELF file names, or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            (phoff,) = struct.unpack_from("<Q", head, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack("<IIQQQQ", f.read(40))
                if p_type == 3:  # PT_INTERP
                    f.seek(p_offset)
                    return f.read(p_filesz).rstrip(b"\0").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


@functools.cache
def host_helpers() -> dict[str, list[str]]:
    """argv prefixes that start each helper of HELPERS inside an image's root through the host's
    loader; a helper this host lacks, or a host whose loader cannot be found, is left out (the
    sandbox then starts the image's program of that name)."""
    bash = shutil.which("bash")
    interp = elf_interpreter(os.path.realpath(bash)) if bash else None
    if interp is None:
        return {}
    loader = os.path.realpath(interp)
    lib_dirs = dict.fromkeys(d for d in (os.path.dirname(loader), "/usr/lib", "/lib", "/usr/local/lib") if os.path.isdir(d))
    libs = ":".join(HOST_INSIDE + os.path.realpath(d) for d in lib_dirs)
    helpers = {}
    for name in HELPERS:
        found = shutil.which(name)
        if found:
            program = HOST_INSIDE + os.path.realpath(found)
            dynamic = elf_interpreter(os.path.realpath(found)) is not None
            helpers[name] = [HOST_INSIDE + loader, "--library-path", libs, program] if dynamic else [program]
    return helpers
