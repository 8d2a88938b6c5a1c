"""Where Harbor's fixed container paths live in a local rollout directory.

Harbor addresses fixed absolute paths inside its environment (harbor/models/trial/paths.py,
EnvironmentPaths): /logs/agent, /logs/verifier, /logs/artifacts, /tests, /solution, plus the
task's workdir. In the local environment (local_env.py) each is a directory inside the rollout
directory, bound at its absolute path by bubblewrap:

    /logs            <rollout>/harbor/logs   (agent/, artifacts/ inside)
    /logs/verifier   <rollout>/verifier      (the sandbox's own verifier dir, as for our verify)
    /tests           <rollout>/harbor/tests
    /solution        <rollout>/harbor/solution
    <workdir>        <rollout>/workspace     (task.toml [environment].workdir, default /app)
    /tmp             <rollout>/tmp
    /installed-agent <rollout>/harbor/installed-agent

One table serves both the bubblewrap binds and the mapping of a path back to the rollout
directory. Pure: names only, no file is looked at.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from harness_env.core.errors import SandboxError

ENV_TYPE = "harness-env-local"
VERIFIER_REL = "verifier"  # the sandbox's verifier directory, relative to the rollout directory
# Top-level directories a workdir may not live under: bwrap can't create a mount point inside the
# host's read-only system directories, and the others are the sandbox's own mounts.
FORBIDDEN_WORKDIR_TOPS = frozenset(
    {"", "usr", "bin", "sbin", "lib", "lib64", "etc", "var", "opt", "proc", "dev", "sys", "tmp", "logs", "tests", "solution", "root", "home", "run", "boot"}
)


def check_workdir(workdir: str) -> None:
    """ValueError when `workdir` cannot be bound: not absolute, with '..', or under a forbidden top."""
    wd = PurePosixPath(workdir)
    if not wd.is_absolute() or ".." in wd.parts or wd.parts[1:2] == () or wd.parts[1] in FORBIDDEN_WORKDIR_TOPS:
        raise ValueError(
            f"{ENV_TYPE} cannot map workdir {workdir!r}: it must be an absolute path under a "
            f"top-level directory other than {sorted(t for t in FORBIDDEN_WORKDIR_TOPS if t)}"
        )


def container_binds(workdir: str) -> dict[str, str]:
    """Harbor's fixed container paths -> subdirectories of the rollout directory (bwrap binds
    them; rel_path maps them back). /logs/verifier is the sandbox's own verifier directory."""
    return {
        "/logs": "harbor/logs",
        "/tests": "harbor/tests",
        "/solution": "harbor/solution",
        "/installed-agent": "harbor/installed-agent",  # Harbor's agent setup makes it
        "/tmp": "tmp",
        workdir: "workspace",
    }


def _mapping(workdir: str) -> list[tuple[PurePosixPath, str]]:
    """(container path, its directory relative to the rollout directory), longest first."""
    pairs = [(PurePosixPath("/logs/verifier"), VERIFIER_REL)]
    pairs += [(PurePosixPath(inside), rel) for inside, rel in container_binds(workdir).items()]
    return sorted(pairs, key=lambda p: len(p[0].parts), reverse=True)


def rel_path(path: str | PurePosixPath, workdir: str, rollout_root: str) -> str:
    """An environment path as a path relative to the rollout directory, by name only (no link is
    resolved: callers open it with safefs, from the rollout directory, which the agent cannot
    replace). Relative paths are relative to the workdir; absolute ones are one of the mapped
    directories or already inside the rollout directory. SandboxError otherwise, or for a path
    with '..' in it."""
    p = PurePosixPath(path)
    if not p.is_absolute():
        p = PurePosixPath(workdir) / p
    if ".." in p.parts:
        raise SandboxError(f"{ENV_TYPE}: path {str(path)!r} goes up with '..'")
    root = PurePosixPath(rollout_root)
    if p.is_relative_to(root):  # bound at its own path (may be under /tmp)
        return str(p.relative_to(root))
    for inside, rel in _mapping(workdir):
        if p == inside or p.is_relative_to(inside):
            return str(PurePosixPath(rel).joinpath(*p.relative_to(inside).parts))
    raise SandboxError(f"{ENV_TYPE}: path {str(path)!r} is outside the environment's mapped directories")
