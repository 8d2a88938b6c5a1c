"""Task images: a task's OCI image pulled with skopeo and unpacked with umoci into a cache keyed by
the image's digest, so the local sandbox can run on it as its root (imageroot.py mounts it).

A task names an image as a registry reference (`host[:port]/org/name:tag`, `name@sha256:...`; a
registry on loopback is spoken to over plain HTTP, as Docker does) or in one of skopeo's local
transports (`oci:PATH:TAG`, `oci-archive:PATH`, `docker-archive:PATH`). The key is the sha256 of
the image's manifest as its source serves it (`skopeo inspect --raw`: one small request), so a
cached image is never pulled again. A pull is unpacked in a leased temporary directory of the cache
and renamed into place only when complete: an entry that exists is whole, a failed pull or unpack
leaves nothing, and what a killed server left is swept at the next start (sweep.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from harness_env.core.errors import InvalidRequestError, SandboxError
from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.cachebound import CacheBound, evict
from harness_env.core.sandbox.host import entries_below_overlays, sandboxes_root
from harness_env.core.sandbox.lease import TEMP_DIR_PREFIX, lease_path, write_lease
from harness_env.models.base import LOCAL_IMAGE_TRANSPORTS, is_loopback

LOCAL_TRANSPORTS = LOCAL_IMAGE_TRANSPORTS
PULL_TIMEOUT_S = 1800.0
INSPECT_TIMEOUT_S = 120.0
INSTALL_HINT = "install them: apt-get install skopeo umoci"
SIZE_VAR, AGE_VAR = "HARNESS_ENV_IMAGE_CACHE_MB", "HARNESS_ENV_IMAGE_CACHE_AGE_S"
DEFAULT_MB, DEFAULT_AGE_S = 20_480, 14 * 24 * 3600.0
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.RLock()  # also held while the cache is bounded: no entry is taken meanwhile
_held: Counter[str] = Counter()  # digest -> rollouts between ensure_image and their overlay's mount


@dataclass(frozen=True)
class TaskImage:
    """An unpacked image of the cache: its root filesystem and what its config asks for."""

    ref: str  # as the task names it
    digest: str  # sha256:<hex> of the manifest, as its source serves it
    rootfs: str
    env: dict[str, str]
    workdir: str | None
    user: tuple[int, int] | None  # uid/gid of the config's User (umoci looks a name up in the image's /etc/passwd)


def image_cache_root() -> Path:
    """Beside the sandbox directory ($HARNESS_ENV_SANDBOX_DIR): /tmp/harness-env-images by default."""
    sandboxes = sandboxes_root()
    return sandboxes.with_name(sandboxes.name + "-images")


def _is_loopback(registry: str) -> bool:
    """`registry` (host, host:port, [v6]:port) names this machine."""
    if registry.startswith("[") and "]" in registry:
        host = registry[1 : registry.index("]")]
    else:
        host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    return is_loopback(host)


def source_of(ref: str) -> tuple[str, bool]:
    """(skopeo's name of `ref`, whether it is a registry on loopback spoken to over plain HTTP)."""
    if ref.startswith(LOCAL_TRANSPORTS):
        return ref, False
    if ref.startswith("-") or "://" in ref or any(c.isspace() for c in ref):
        raise SandboxError(f"image {ref!r} is neither a registry reference nor oci:, oci-archive: or docker-archive:")
    first = ref.split("/", 1)[0]
    registry = first if "/" in ref and ("." in first or ":" in first or first == "localhost") else ""
    return f"docker://{ref}", bool(registry) and _is_loopback(registry)


def check_remote_image(ref: str) -> str:
    """`ref` as a caller of the server may name it: a registry reference. A local transport names a
    file on the server's disk, which a remote caller may not read (as for task directories: only
    the CLI and the in-process API, on the server's machine, name server paths)."""
    if ref.startswith(LOCAL_TRANSPORTS):
        raise InvalidRequestError(
            f"image {ref[:200]!r} names a file on the server's disk ({ref.split(':', 1)[0]}:), which callers of "
            "the server may not name; push the image to a registry the server reaches and give its reference, "
            "or run the task on that machine (harness-env run, or the in-process API)"
        )
    try:
        source_of(ref)
    except SandboxError as e:
        raise InvalidRequestError(str(e)) from None
    return ref


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SandboxError(f"task images need {name}, which is not installed here; {INSTALL_HINT}")
    return path


def run_tool(argv: list[str], what: str, timeout: float, advice: str = "") -> bytes:
    """`argv`'s output; one SandboxError saying `what` failed (its last line of stderr), or that it
    gave no answer within `timeout` (then `advice`). Its whole process group is killed at the end,
    not the tool alone: what it started (a build's RUN step, root in its chroot) does not outlive it."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=max(0.0, timeout))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SandboxError(f"{what}: no answer within {timeout:.0f}s{advice}") from None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever it left running in the background
    if proc.returncode != 0:
        lines = err.decode("utf-8", "replace").strip().splitlines()
        raise SandboxError(f"{what}: {(lines[-1] if lines else f'exit {proc.returncode}')[:500]}")
    return out


def _skopeo(*args: str, plain_http: bool, flag: str) -> list[str]:
    argv = [_tool("skopeo")]
    if not any(os.path.exists(p) for p in ("/etc/containers/policy.json", os.path.expanduser("~/.config/containers/policy.json"))):
        argv.append("--insecure-policy")  # no policy installed: skopeo refuses everything without one
    return [*argv, args[0], *([flag] if plain_http else []), *args[1:]]


def manifest_digest(ref: str) -> str:
    """sha256:<hex> of the image's manifest as its source serves it; one clear error when it cannot be read."""
    source, plain = source_of(ref)
    raw = run_tool(_skopeo("inspect", "--raw", source, plain_http=plain, flag="--tls-verify=false"), f"could not read image {ref!r}", INSPECT_TIMEOUT_S)
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def ensure_image(ref: str) -> TaskImage:
    """The unpacked image `ref`, pulled and unpacked first unless the cache has it. Blocking."""
    _tool("skopeo"), _tool("umoci")
    bound = image_cache_bound()  # a bad setting is said before any pull
    digest = manifest_digest(ref)
    cache = image_cache_root()
    entry = cache / digest.replace(":", "-")
    with _locks_guard:
        _held[digest] += 1  # first: from here on it is not evicted
    try:
        with lock_of(digest):
            if not (entry / "config.json").is_file():
                _pull(ref, cache, entry, digest)
                evict_images(bound)
            os.utime(entry)  # its last use: the least recently used are evicted first
        return _load(ref, digest, entry)
    except BaseException:
        release_image(digest)
        raise


def release_image(digest: str) -> None:
    """The rollout that ensure_image gave `digest` has mounted it (or will not): the mount, or
    nothing, keeps it from eviction now."""
    with _locks_guard:
        _held[digest] -= 1
        if _held[digest] <= 0:
            del _held[digest]


def image_cache_bound(env: dict[str, str] | None = None) -> CacheBound:
    """The cache's bound from the server's environment (0: none of that kind)."""
    return CacheBound.from_env(SIZE_VAR, AGE_VAR, DEFAULT_MB, DEFAULT_AGE_S, env)


def mounted_entries(cache: Path) -> set[str]:
    """Names of the cache's entries some overlay on this machine has as its lower layer."""
    return entries_below_overlays(cache)


def evict_images(bound: CacheBound | None = None, now: float | None = None) -> list[str]:
    """Bound the cache: entries unused past the age, then the least recently used past the size,
    go; never one a rollout holds or has mounted. The names removed."""
    cache = image_cache_root()
    with _locks_guard:
        in_use = {d.replace(":", "-") for d in _held} | mounted_entries(cache)
        return evict(
            cache, bound or image_cache_bound(), in_use, time.time() if now is None else now, entry=lambda name: name.startswith(("sha256-", "build-"))
        )  # unpacked images, built layouts (build.py)


def pinned_source(source: str, digest: str) -> str:
    """A registry source pinned to the manifest `digest` read before (its tag may move, or a hostile
    registry answer otherwise, between that read and the pull: the entry would hold what its name
    does not say); a local transport as it is (the server's own files)."""
    if not source.startswith("docker://"):
        return source
    name = source[len("docker://") :].split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name[: name.rfind(":")]
    return f"docker://{name}@{digest}"


def images_locked() -> threading.RLock:
    """The lock eviction holds: what is done under it sees no entry removed meanwhile."""
    return _locks_guard


def lock_of(digest: str) -> threading.Lock:  # one pull (or build) of an entry at a time
    with _locks_guard:
        return _locks.setdefault(digest, threading.Lock())


def _pull(ref: str, cache: Path, entry: Path, digest: str) -> None:
    source, plain = source_of(ref)
    source = pinned_source(source, digest)
    # The server's alone: entries are unpacked as root with their owners, setuid bits and device
    # nodes; the sandbox sees an image only through its overlay root, mounted by the server.
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(cache, 0o700)
    tmp = cache / f"{TEMP_DIR_PREFIX}pull-{uuid.uuid4().hex[:12]}"
    write_lease(tmp)  # before the directory: a killed pull is swept at the next start
    try:
        tmp.mkdir(mode=0o755)
        run_tool(
            _skopeo("copy", "--quiet", source, f"oci:{tmp / 'layout'}:image", plain_http=plain, flag="--src-tls-verify=false"),
            f"could not pull image {ref!r}",
            PULL_TIMEOUT_S,
        )
        # As root the image's owners are kept (its root-owned files stay out of the agent's reach).
        rootless = [] if os.geteuid() == 0 else ["--rootless"]
        run_tool(
            [_tool("umoci"), "unpack", *rootless, "--image", f"{tmp / 'layout'}:image", str(tmp / "bundle")], f"could not unpack image {ref!r}", PULL_TIMEOUT_S
        )
        bundle = tmp / "bundle"
        os.chmod(bundle, 0o755)  # umoci makes it 0700: the sandbox's uid must cross it to reach rootfs
        try:
            os.rename(bundle, entry)
        except OSError:
            if not (entry / "config.json").is_file():  # another server won the race: its entry is whole
                raise
    except OSError as e:
        raise SandboxError(f"could not store image {ref!r} in the cache {cache}: {e.strerror or e}") from e
    finally:
        if safefs.remove_tree(tmp) is None:
            lease_path(tmp).unlink(missing_ok=True)


def _load(ref: str, digest: str, entry: Path) -> TaskImage:
    try:
        process = json.loads((entry / "config.json").read_text()).get("process") or {}
    except (OSError, ValueError) as e:
        raise SandboxError(f"the cached image {entry} has no readable config: {e}; remove the directory") from e
    env = dict(item.split("=", 1) for item in process.get("env") or [] if "=" in item)
    user = process.get("user") or {}
    uid, gid = user.get("uid"), user.get("gid")
    return TaskImage(
        ref=ref,
        digest=digest,
        rootfs=str(entry / "rootfs"),
        env=env,
        workdir=_workdir(process.get("cwd")),
        user=(int(uid), int(gid or 0)) if isinstance(uid, int) else None,
    )


def _workdir(cwd: object) -> str | None:
    """The config's WorkingDir as a clean absolute path; None for none, `/` or a relative one."""
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        return None
    path = os.path.normpath(cwd)
    return None if path in ("/", "//") else path
