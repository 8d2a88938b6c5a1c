"""Pure builder for the bubblewrap command line of one sandboxed command.

Layout inside: an allow-list of the host's system directories read-only (/usr and its merged-/usr
links, /etc with its unreadable secrets masked; never /opt, /srv, /var, /work or the project's
files), the harness's own toolchain read-only, fresh size-limited tmpfs over /tmp, /var/tmp, /root,
/home and /run, every other rollout hidden, the rollout directory read-only at its own path with
only the agent's directories (workspace, home, tmp, xdg, logs) writable, so the agent can neither
replace the verifier directory nor plant links next to it; the verifier directory is writable only
while verify commands run, and also appears at /logs/verifier and /root/logs/verifier (so Harbor
and pi_env verify scripts run unchanged). A private PID namespace: killing bwrap kills everything
inside.

The command runs as an unprivileged uid (`run_as`, through setpriv: all capabilities and the
bounding set dropped, no new privileges) when the server can switch to one, else as root with
every capability dropped. With `capture_socket`, the command has its own network namespace whose
only way out is the capture proxy's Unix socket, which socat forwards to 127.0.0.1:`capture_port`
inside; the server's own API and every other host stay out of reach.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

# Top-level host directories the sandbox sees (read-only); everything else is absent.
ALLOWED_TOP = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc"})
VERIFIER_MOUNTS = ("/logs/verifier", "/root/logs/verifier")
TMPFS_PATHS = ("/tmp", "/var/tmp", "/root", "/home", "/run")  # fresh and empty in every command
STICKY_TMP = frozenset({"/tmp", "/var/tmp"})
CAPTURE_SOCKET_INSIDE = "/run/harness-env/capture.sock"
DEFAULT_CAPTURE_PORT = 18080


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
    # Host directories under rollout_dir the command may write; the rest of rollout_dir is
    # read-only. Empty: all of rollout_dir is writable (no agent runs there, e.g. Harbor's trial).
    writable_dirs: list[str] = field(default_factory=list)
    verifier_writable: bool = True
    masked_paths: list[str] = field(default_factory=list)  # host files hidden behind /dev/null
    masked_dirs: list[str] = field(default_factory=list)  # host dirs hidden behind an empty tmpfs
    tmpfs_size_bytes: int | None = None
    run_as: tuple[int, int] | None = None  # (uid, gid) to drop to inside, via setpriv
    capture_socket: str | None = None  # host path: when set, the network is cut but for it
    capture_port: int = DEFAULT_CAPTURE_PORT
    image_root: str | None = None  # host path of a task image's root (its overlay): bound at /
    host_dir: str = ""  # with image_root: where the host's system directories appear
    helpers: dict[str, list[str]] = field(default_factory=dict)  # program name -> argv prefix that starts it
    # A task image's Env: set by `env` right before the command, after the drop to run_as.
    inner_env: dict[str, str] = field(default_factory=dict)
    # inside path -> a path it links to: a group member's own directory where the group's setup ran
    aliases: dict[str, str] = field(default_factory=dict)


def bwrap_argv(bwrap: str, spec: BwrapSpec, command: list[str]) -> list[str]:
    argv = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    if spec.image_root is not None:
        argv += ["--bind", spec.image_root, "/"]  # first: every mount below lands on it
    argv += ["--proc", "/proc", "--dev", "/dev", "--ro-bind-try", "/sys", "/sys"]
    if spec.run_as is None:
        argv += ["--cap-drop", "ALL"]  # otherwise setpriv drops them, after switching uid
    if spec.capture_socket is not None:
        argv.append("--unshare-net")
    if spec.image_root is None:
        argv += _system_dirs(spec.root_entries, "")
    size = ["--size", str(spec.tmpfs_size_bytes)] if spec.tmpfs_size_bytes else []
    for tmp in TMPFS_PATHS:
        perms = ["--perms", "1777"] if tmp in STICKY_TMP else []  # writable by the unprivileged uid
        argv += ["--bind", spec.extra_binds[tmp], tmp] if tmp in spec.extra_binds else [*size, *perms, "--tmpfs", tmp]
    if spec.image_root is not None:  # after the tmpfs over /run, which would hide them
        argv += [*_open_parents(spec.host_dir + "/x"), *_system_dirs(spec.root_entries, spec.host_dir)]
    argv += ["--tmpfs", spec.sandboxes_dir]
    for inside, target in spec.aliases.items():
        argv += ["--symlink", target, inside]
    if spec.writable_dirs:
        argv += ["--ro-bind", spec.rollout_dir, spec.rollout_dir]
        for d in spec.writable_dirs:
            argv += ["--bind", d, d]
    else:
        argv += ["--bind", spec.rollout_dir, spec.rollout_dir]
    for path in spec.ro_paths:
        argv += [*_open_parents(path), "--ro-bind", path, path]
    for inside, host in sorted(spec.extra_binds.items(), key=lambda kv: kv[0].count("/")):
        if inside not in TMPFS_PATHS:
            argv += ["--bind", host, inside]
    verifier_bind = "--bind" if spec.verifier_writable else "--ro-bind"
    argv += [verifier_bind, spec.verifier_dir, spec.verifier_dir]
    for mount in VERIFIER_MOUNTS:
        argv += ["--dir", mount.rsplit("/", 1)[0], verifier_bind, spec.verifier_dir, mount]
    for path in spec.masked_paths:
        argv += ["--ro-bind", "/dev/null", path]
    for path in spec.masked_dirs:
        argv += ["--tmpfs", path]
    if spec.capture_socket is not None:
        argv += ["--perms", "0755", "--dir", CAPTURE_SOCKET_INSIDE.rsplit("/", 1)[0], "--bind", spec.capture_socket, CAPTURE_SOCKET_INSIDE]
    argv += ["--chdir", spec.workdir, "--"]
    if spec.run_as is not None:
        uid, gid = spec.run_as
        argv += [
            *spec.helpers.get("setpriv", ["setpriv"]),
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--no-new-privs",
            "--",
        ]
    if spec.capture_socket is not None:
        script = forwarder_script(spec.capture_port, spec.helpers.get("socat", ["socat"]), spec.helpers.get("sleep", ["sleep"]))
        argv += [*spec.helpers.get("bash", ["bash"]), "-c", script, "harness-env-net"]
    if spec.inner_env:
        argv += [*spec.helpers.get("env", ["env"]), *(f"{k}={v}" for k, v in spec.inner_env.items())]
    return argv + command


def _system_dirs(entries: list[RootEntry], under: str) -> list[str]:
    """The host's allowed top-level directories read-only (their merged-/usr links as links) at
    `under` + their own path; under an image's root, without the host's /etc."""
    args: list[str] = []
    for entry in entries:
        if entry.name not in ALLOWED_TOP or (under and entry.name == "etc"):
            continue
        path = "/" + entry.name
        if entry.symlink_target is not None:
            args += ["--symlink", entry.symlink_target, under + path]
        elif entry.is_dir:
            args += ["--ro-bind", path, under + path]
    return args


def _open_parents(path: str) -> list[str]:
    """Directories leading to `path` made world-readable: bwrap would create them 0700, which the
    unprivileged uid cannot cross (e.g. /root/.local/... over the fresh /root)."""
    parts = path.strip("/").split("/")[:-1]
    args: list[str] = []
    for i in range(2, len(parts) + 1):  # the top level is a host dir or one of the tmpfs mounts
        args += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
    return args


def forwarder_script(port: int, socat: list[str] | None = None, sleep: list[str] | None = None) -> str:
    """Shell run before the command in a cut-off network: socat forwards 127.0.0.1:`port` to the
    capture socket; the command starts once the port answers (socat starts in milliseconds)."""
    sock = shlex.quote(CAPTURE_SOCKET_INSIDE)
    socat_cmd, sleep_cmd = shlex.join(socat or ["socat"]), shlex.join(sleep or ["sleep"])
    return (
        f"{socat_cmd} TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:{sock} </dev/null >/dev/null 2>&1 &\n"
        f"i=0; until (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; do i=$((i+1)); "
        f"[ $i -ge 500 ] && break; {sleep_cmd} 0.01; done\n"
        'exec "$@"'
    )


def capture_url(port: int = DEFAULT_CAPTURE_PORT) -> str:
    """The capture proxy's base URL as a command in a cut-off network sees it."""
    return f"http://127.0.0.1:{port}/v1"
