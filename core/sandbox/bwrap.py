"""Pure builder for the bubblewrap command line of one sandboxed command.

Layout inside: the host's system directories read-only, fresh tmpfs over /tmp, /root, /home and
/run (no host credentials), the rollout directory bound read-write at its own path (so paths in
harness configs need no translation), every other rollout hidden, the rollout's verifier directory
also at /logs/verifier and /root/logs/verifier (so Harbor and pi_env verify scripts run unchanged),
a private PID namespace (killing bwrap kills everything inside) and the host network (loopback must
reach the capture proxy; `--unshare-net` would cut it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Top-level directories never exposed from the host: secrets, other users, volatile state.
HIDDEN_TOP = frozenset({"proc", "dev", "sys", "tmp", "root", "home", "run", "mnt", "media", "lost+found", "boot"})
VERIFIER_MOUNTS = ("/logs/verifier", "/root/logs/verifier")
TMPFS_PATHS = ("/tmp", "/root", "/home", "/run")  # fresh and empty in every command


@dataclass(frozen=True)
class RootEntry:
    name: str
    symlink_target: str | None = None  # e.g. /bin -> usr/bin on merged-/usr systems
    is_dir: bool = True


@dataclass(frozen=True)
class BwrapSpec:
    root_entries: list[RootEntry]
    rollout_dir: str
    sandboxes_dir: str  # parent of all rollout dirs: hidden, then our own dir re-bound
    workdir: str
    verifier_dir: str
    ro_paths: list[str] = field(default_factory=list)  # e.g. the harness tools dir
    # Extra read-write binds, inside path -> host dir (e.g. Harbor's /tests, /solution, /app),
    # applied after the tmpfs mounts and before the verifier mounts. One of the tmpfs paths
    # (/tmp, ...) is bound in the tmpfs's place instead, so the rollout directory (which may live
    # under the host's /tmp) is still bound on top of it.
    extra_binds: dict[str, str] = field(default_factory=dict)


def bwrap_argv(bwrap: str, spec: BwrapSpec, command: list[str]) -> list[str]:
    argv = [
        bwrap,
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname", "sandbox",
        "--cap-drop", "ALL",
        "--proc", "/proc",
        "--dev", "/dev",
        "--ro-bind-try", "/sys", "/sys",
    ]
    for entry in spec.root_entries:
        if entry.name in HIDDEN_TOP:
            continue
        path = "/" + entry.name
        if entry.symlink_target is not None:
            argv += ["--symlink", entry.symlink_target, path]
        elif entry.is_dir:
            argv += ["--ro-bind", path, path]
    for tmp in TMPFS_PATHS:
        argv += ["--bind", spec.extra_binds[tmp], tmp] if tmp in spec.extra_binds else ["--tmpfs", tmp]
    argv += ["--tmpfs", spec.sandboxes_dir, "--bind", spec.rollout_dir, spec.rollout_dir]
    for path in spec.ro_paths:
        argv += ["--ro-bind", path, path]
    for inside, host in sorted(spec.extra_binds.items(), key=lambda kv: kv[0].count("/")):
        if inside not in TMPFS_PATHS:
            argv += ["--bind", host, inside]
    for mount in VERIFIER_MOUNTS:
        argv += ["--dir", mount.rsplit("/", 1)[0], "--bind", spec.verifier_dir, mount]
    argv += ["--chdir", spec.workdir, "--"]
    return argv + command
