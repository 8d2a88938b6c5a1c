"""A task's Dockerfile built into an image with buildah, for a server whose operator allows it.

Harbor tasks ship an `environment/Dockerfile` more often than a prebuilt image. With
$HARNESS_ENV_BUILD_DOCKERFILES=1 the local sandbox builds it (buildah, Debian's package, `--isolation
chroot`: no daemon, no runtime) into an OCI layout in the image cache, keyed by the Dockerfile and
every file of its build context, so a group or a dataset that shares an environment builds it once;
the layout is then pulled like any local image (images.py). The build's RUN steps run as root on
this machine, in a chroot that is no sandbox: only an operator who trusts the tasks turns it on.

A build runs in a leased temporary directory of the cache (its buildah storage included) and is
renamed into place only when whole: a failed or killed build leaves nothing (sweep.py removes what
a killed server left). Built layouts are bounded with the images (evict_images).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import time
import uuid
from pathlib import Path

from harness_env.core.errors import SandboxError
from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.images import LOCAL_TRANSPORTS, image_cache_root, images_locked, lock_of, run_tool, source_of
from harness_env.core.sandbox.lease import TEMP_DIR_PREFIX, lease_path, write_lease

BUILD_VAR = "HARNESS_ENV_BUILD_DOCKERFILES"
BUILD_PREFIX = "build-"  # a built layout's entry in the image cache
BUILD_TIMEOUT_S = 1800.0
TAG = "localhost/harness-env-task:build"


def find_buildah() -> str | None:
    return shutil.which("buildah")


def builds_allowed(env: dict[str, str] | None = None) -> bool:
    return (os.environ if env is None else env).get(BUILD_VAR, "") == "1"


def context_key(context: Path, dockerfile: Path) -> str:
    """sha256 of the Dockerfile and of every entry of the build context (its path, type, mode and
    content or link target), in path order: the same environment gives the same key."""
    h = hashlib.sha256(dockerfile.read_bytes())
    for parent, dirs, files in sorted(os.walk(context)):
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(parent, d))]):
            path = os.path.join(parent, name)
            st = os.lstat(path)
            h.update(f"\0{os.path.relpath(path, context)}\0{stat.S_IFMT(st.st_mode)}\0{stat.S_IMODE(st.st_mode)}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
    return h.hexdigest()


def base_images(dockerfile: str) -> list[str]:
    """The images the Dockerfile's FROM lines name (not earlier stages, not `scratch`)."""
    stages: set[str] = set()
    found = []
    for line in dockerfile.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].upper() == "FROM":
            image = next((w for w in words[1:] if not w.startswith("--")), "")
            if image and image.lower() != "scratch" and image not in stages:
                found.append(image)
            if len(words) >= 4 and words[-2].upper() == "AS":
                stages.add(words[-1])
    return found


def plain_http(dockerfile: str) -> bool:
    """Whether the build speaks plain HTTP: every image it pulls is on a registry on loopback (as
    for a task's image, images.py); TLS is verified otherwise."""
    sources = [source_of(image) for image in base_images(dockerfile) if not image.startswith(LOCAL_TRANSPORTS)]
    return bool(sources) and all(plain for _, plain in sources)


def buildah_argv(buildah: str, storage: Path, context: Path, dockerfile: Path, plain: bool) -> list[list[str]]:
    """The commands that build `dockerfile` in `context` with storage of their own under `storage`
    and write the image as an OCI layout `storage`/layout:image."""
    store = ["--root", str(storage / "root"), "--runroot", str(storage / "run"), "--storage-driver", "vfs"]
    return [
        [buildah, *store, "build", "--isolation", "chroot", *(["--tls-verify=false"] if plain else []), "-f", str(dockerfile), "-t", TAG, str(context)],
        [buildah, *store, "push", TAG, f"oci:{storage / 'layout'}:image"],
    ]


def build_image(context: Path, timeout: float = BUILD_TIMEOUT_S) -> str:
    """The image `context`/Dockerfile builds, as an `oci:` reference in the image cache (built now
    unless the cache has it). Blocking; one SandboxError says what failed."""
    buildah = find_buildah()
    if buildah is None:
        raise SandboxError(
            f"building the task's Dockerfile needs buildah, which is not installed here; apt-get install buildah "
            f"(or unset {BUILD_VAR} and name a prebuilt image as docker_image)"
        )
    dockerfile = context / "Dockerfile"
    try:
        key = context_key(context, dockerfile)
    except OSError as e:
        raise SandboxError(f"could not read the task's build context {context}: {e.strerror or e}") from e
    cache = image_cache_root()
    entry = cache / f"{BUILD_PREFIX}{key}"
    with lock_of(entry.name):
        # Under the cache's lock from the check to the touch: no eviction (images.py) comes between.
        with images_locked():
            built = (entry / "index.json").is_file()
            if built:
                os.utime(entry)  # its last use: the least recently used are evicted first
        if not built:
            _build(buildah, context, dockerfile, cache, entry, time.monotonic() + timeout)
    return f"oci:{entry}:image"


def _build(buildah: str, context: Path, dockerfile: Path, cache: Path, entry: Path, deadline: float) -> None:
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = cache / f"{TEMP_DIR_PREFIX}build-{uuid.uuid4().hex[:12]}"
    write_lease(tmp)  # before the directory: a killed build is swept at the next start
    try:
        tmp.mkdir(mode=0o700)
        for argv in buildah_argv(buildah, tmp, context, dockerfile, plain_http(dockerfile.read_text(errors="replace"))):
            run_tool(argv, "could not build the task's Dockerfile", deadline - time.monotonic(), advice="; raise the task's build_timeout_sec")
        with images_locked():  # renamed and touched before any eviction can see it
            try:
                os.rename(tmp / "layout", entry)
            except OSError:
                if not (entry / "index.json").is_file():  # another server won the race: its entry is whole
                    raise
            os.utime(entry)
    except OSError as e:
        raise SandboxError(f"could not store the built image in the cache {cache}: {e.strerror or e}") from e
    finally:
        if safefs.remove_tree(tmp) is None:
            lease_path(tmp).unlink(missing_ok=True)
