"""Git repositories the agent left, made safe for verify to run git in.

Git starts programs named in a repository's own config: diff and merge drivers, textconv, clean
and smudge filters, signature programs, pagers, editors, helpers, hooks paths, fsmonitor, and
whatever an `include.path` pulls in. `.gitattributes` in the work tree only names a driver; the
program comes from config. No environment variable stops git reading a repository's config, and
no config key disables a per-driver `diff.<name>.command`, so before verify every repository
config in the agent's directories is reduced to an allow-list of keys that only describe data
(format, remotes, branches, identity). Anything else, known or not, is dropped: a class closed by
construction rather than a list of attacks. Attributes stay as the agent wrote them: without a
driver in config they only select git's built-in behaviour.

The config is read by git itself (`git config --file F --list --null --no-includes`), so what is
kept is exactly what git would have read, and it is written back in one canonical form. A file git
cannot parse is left alone (git refuses the repository then: nothing runs). Runs with every agent
process dead (the start of verify), so nothing rewrites a file after it was checked.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from harness_env.core.sandbox.envvars import SYSTEM_PATH

# Keys kept, by section; a section maps to the keys allowed in it (lower case, as git lists them).
# "*" allows every key of the section. Sections with a subsection (remote "origin") are listed by
# their section name. None of these names a program, a command, a hook or another config file.
ALLOWED_KEYS: dict[str, frozenset[str]] = {
    "core": frozenset(
        {
            "repositoryformatversion",
            "filemode",
            "bare",
            "logallrefupdates",
            "ignorecase",
            "precomposeunicode",
            "symlinks",
            "autocrlf",
            "eol",
            "safecrlf",
            "quotepath",
            "worktree",
            "checkstat",
            "trustctime",
            "sharedrepository",
            "abbrev",
            "commentchar",
            "whitespace",
            "protecthfs",
            "protectntfs",
            "longpaths",
            "splitindex",
            "untrackedcache",
            "compression",
            "loosecompression",
            "bigfilethreshold",
            "excludesfile",
        }
    ),
    # An unknown extension makes git refuse the repository: harmless. partialClone is not kept: a
    # missing object would start a fetch from a remote the agent named.
    "extensions": frozenset({"objectformat", "worktreeconfig", "preciousobjects", "noop", "refstorage"}),
    "user": frozenset({"name", "email"}),
    "author": frozenset({"name", "email"}),
    "committer": frozenset({"name", "email"}),
    "init": frozenset({"defaultbranch"}),
    "remote": frozenset({"url", "pushurl", "fetch", "push", "tagopt", "prune", "mirror", "promisor", "partialclonefilter"}),
    "branch": frozenset({"remote", "pushremote", "merge", "rebase", "description"}),
    "submodule": frozenset({"url", "path", "active", "branch", "ignore", "shallow", "fetchrecursesubmodules", "update"}),
    "index": frozenset({"version"}),
    "i18n": frozenset({"commitencoding", "logoutputencoding"}),
    "pull": frozenset({"rebase", "ff"}),
    "push": frozenset({"default"}),
    "fetch": frozenset({"prune"}),
}
# `submodule.<name>.update` may be "!command" in config: only git's own strategies are kept.
SUBMODULE_UPDATE_VALUES = frozenset({"checkout", "rebase", "merge", "none"})
CONFIG_NAMES = ("config", "config.worktree")
MAX_CONFIG_BYTES = 4 * 1024 * 1024  # larger: replaced by an empty config (git's defaults)
MAX_ENTRIES = 1_000_000  # directory entries looked at in all; past it the walk stops (fails closed)
MAX_CONFIGS = 256  # configs read (a git subprocess each); past it the walk stops (fails closed)
GIT_TIMEOUT_S = 20


class ConfigUnreadable(Exception):
    """git could not be run on a config (timeout, no git): its entries are unknown."""


@dataclass
class GitGuardReport:
    rewritten: list[str] = field(default_factory=list)  # configs that lost keys, relative to the rollout
    dropped_keys: set[str] = field(default_factory=set)
    configs_read: int = 0
    # Why some part of the agent's tree went unchecked (too many entries or configs, a directory
    # that cannot be listed, a config that cannot be replaced): verify's git then sees no
    # repository at all, rather than one that was not checked.
    unchecked: str | None = None

    def notes(self) -> list[str]:
        out = []
        if self.rewritten:
            shown = ", ".join(sorted(self.dropped_keys)[:8])
            out.append(f"verify saw {len(self.rewritten)} git config(s) without keys that start programs ({shown})")
        if self.unchecked:
            out.append(f"the agent's git configs could not all be checked ({self.unchecked}): verify's git sees no repository (GIT_DIR=/dev/null)")
        return out


def allowed(key: str, value: str | None) -> bool:
    """Whether a config entry (git's canonical `section[.subsection].name`) may stay."""
    section, _, rest = key.partition(".")
    name = rest.rsplit(".", 1)[-1]
    keys = ALLOWED_KEYS.get(section)
    if keys is None or not rest:
        return False
    has_subsection = "." in rest
    if has_subsection != (section in ("remote", "branch", "submodule")):
        return False  # e.g. core.<x>.<y>, or remote.url with no remote name
    if section == "submodule" and name == "update":
        return value in SUBMODULE_UPDATE_VALUES
    return "*" in keys or name in keys


def parse_listing(out: bytes) -> list[tuple[str, str | None]]:
    """`git config --list --null` output: entries `key\\nvalue\\0`, or `key\\0` for a bare key."""
    entries = []
    for item in out.split(b"\0"):
        if not item:
            continue
        key, sep, value = item.partition(b"\n")
        entries.append((key.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape") if sep else None))
    return entries


def _quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t").replace("\b", "\\b")
    return f'"{escaped}"'


def _header(section: str, sub: str) -> str:
    if not sub:
        return f"[{section}]"
    escaped = sub.replace("\\", "\\\\").replace('"', '\\"')
    return f'[{section} "{escaped}"]'


def render_config(entries: list[tuple[str, str | None]]) -> str:
    """Entries in git's config syntax, one section header per run of entries of a section."""
    lines: list[str] = []
    current = None
    for key, value in entries:
        section, _, rest = key.partition(".")
        sub, _, name = rest.rpartition(".")
        if "\n" in sub or "\0" in sub or (value is not None and "\0" in value):
            continue
        header = _header(section, sub)
        if header != current:
            lines.append(header)
            current = header
        lines.append(f"\t{name}" if value is None else f"\t{name} = {_quote(value)}")
    return "".join(line + "\n" for line in lines)


def _git_env() -> dict[str, str]:
    return {"PATH": SYSTEM_PATH, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": "/nonexistent", "LC_ALL": "C"}


def read_entries(path: Path) -> list[tuple[str, str | None]] | None:
    """The entries git reads from the config file `path` (a regular file), or None when git
    cannot parse it (then git refuses the repository too). Raises ConfigUnreadable when git could
    not be run on it."""
    try:
        proc = subprocess.run(
            ["git", "config", "--file", str(path), "--list", "--null", "--no-includes"],
            capture_output=True,
            env=_git_env(),
            timeout=GIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigUnreadable(f"{path.name}: {type(e).__name__}") from e
    return parse_listing(proc.stdout) if proc.returncode == 0 else None


def looks_like_git_dir(names: set[str]) -> bool:
    """What git itself accepts as a repository directory: HEAD, and objects and refs of its own
    or through a commondir file (a linked worktree's); a commondir target (objects and refs, and
    the config) counts too, HEAD or not."""
    return ("objects" in names and "refs" in names) or "commondir" in names


def neutralise_config(gitdir: Path, name: str, report: GitGuardReport, rel: str) -> None:
    """Reduce gitdir/name to its allowed keys, in place; a link or special file there is replaced
    by a regular file (git would follow the link, or block on a FIFO)."""
    path = gitdir / name
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        return  # git cannot read a directory as config: it refuses the repository
    report.configs_read += 1
    forced = not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CONFIG_BYTES
    entries: list[tuple[str, str | None]] = []
    if not forced:
        try:
            read = read_entries(path)
        except ConfigUnreadable:
            forced = True  # unknown entries: replaced by an empty config (git's defaults)
        else:
            if read is None:
                return  # unparseable: git refuses the repository, nothing runs
            entries = read
    kept: list[tuple[str, str | None]] = []
    dropped: set[str] = set()
    for key, value in entries:  # one pass: a hostile config may hold a few hundred thousand entries
        if allowed(key, value):
            kept.append((key, value))
        else:
            dropped.add(key)
    if not forced and not dropped:
        return
    tmp = gitdir / f".{name}.harness-env-tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, render_config(kept).encode("utf-8", "surrogateescape"))
        os.fchown(fd, st.st_uid, st.st_gid)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    report.dropped_keys |= dropped or {f"<{name} git could not read>"}
    report.rewritten.append(rel)


def _list_dir(here: Path) -> list[os.DirEntry[str]] | None:
    """The entries of `here`, made listable first if the agent took the right away (its files
    are the server's, or the server is root); None when it is gone."""
    try:
        try:
            with os.scandir(here) as it:
                return list(it)
        except PermissionError:
            os.chmod(here, stat.S_IMODE(os.lstat(here).st_mode) | stat.S_IRWXU)
            with os.scandir(here) as it:
                return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return None


def neutralise_git(root: str | Path, dirs: tuple[str, ...] | list[str]) -> GitGuardReport:
    """Every git directory under root/<d> for d in `dirs` (no link followed) has its config and
    config.worktree reduced to ALLOWED_KEYS. Whatever stops the walk (too many entries or
    configs, a directory or config it cannot handle) is in `unchecked`: the caller must then keep
    git from using any repository. Blocking: call it off the event loop."""
    root = Path(root)
    report = GitGuardReport()
    seen = 0
    todo = deque(root / d for d in dirs)
    while todo:  # breadth first: the repositories verify is likeliest to use come first
        here = todo.popleft()
        try:
            entries = _list_dir(here)
        except OSError as e:
            report.unchecked = f"{here.relative_to(root)} cannot be listed: {e.strerror}"
            return report
        if entries is None:
            continue
        seen += len(entries)
        if seen > MAX_ENTRIES:
            report.unchecked = f"over {MAX_ENTRIES} entries"
            return report
        names = {e.name for e in entries}
        if looks_like_git_dir(names):
            for name in CONFIG_NAMES:
                if name not in names:
                    continue
                if report.configs_read >= MAX_CONFIGS:
                    report.unchecked = f"over {MAX_CONFIGS} git configs"
                    return report
                try:
                    neutralise_config(here, name, report, str(here.relative_to(root) / name))
                except OSError as e:
                    report.unchecked = f"{here.relative_to(root) / name} cannot be replaced: {e.strerror}"
                    return report
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    todo.append(Path(e.path))
            except OSError:
                continue
    return report
