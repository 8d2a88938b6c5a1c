"""Copies between the local Harbor environment's rollout directory and Harbor's trial directory.

What the agent left in the sandbox is never trusted. Every path is walked from the rollout
directory (the server's; the agent cannot rename or replace it) without following a link: an
upload replaces a planted link, FIFO or file in its way rather than writing through it, and a
download copies regular files and directories only, each bounded, into Harbor's trial directory,
whose files Harbor's own code (its verifier's reward reader, its agents' log parsers, its secret
scrubber) then reads on the event loop. Harbor's filtered and excluding downloads, which would run
find/tar in the sandbox and copy an archive of any size out, are done the same way from the host.
These are blocking calls: local_env.py runs them in a thread. Harbor itself is not imported here.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from pathlib import Path

from harness_env.core.sandbox import safefs

Select = Callable[[str, bool], bool]


def tar_excluded(path: str, patterns: Sequence[str]) -> bool:
    """Whether tar's `--exclude=PATTERN` (unanchored, wildcards match '/') leaves `path` out: the
    pattern matches some run of whole components of it."""
    parts = path.split("/")
    for i in range(len(parts)):
        for j in range(i + 1, len(parts) + 1):
            run = "/".join(parts[i:j])
            if any(fnmatch.fnmatchcase(run, p.rstrip("/").removeprefix("./")) for p in patterns):
                return True
    return False


def exclusion_select(exclude: Sequence[str]) -> Select:
    """Harbor's download with tar-style excludes (a pattern matches any run of whole path
    components, so an excluded directory goes with its contents), as copy_out's `select`."""
    return lambda path, is_dir: not tar_excluded(path, exclude)


def copy_dir_out(
    root: Path, rel: str, target: Path, select: Select | None, *, max_file_bytes: int, max_total_bytes: int, max_files: int, max_depth: int
) -> safefs.CopyReport | None:
    """safefs.copy_out of root/rel into `target`; a missing source copies nothing (None), and a
    link or a file where the directory was is copied as an empty directory, noted in the report."""
    try:
        return safefs.copy_out(
            root, rel, target, select=select, max_file_bytes=max_file_bytes, max_total_bytes=max_total_bytes, max_files=max_files, max_depth=max_depth
        )
    except FileNotFoundError:  # nothing there: nothing to copy, as before
        target.mkdir(parents=True, exist_ok=True)
        return None
    except OSError as e:  # a link (or a file) where the directory was: copied as empty
        target.mkdir(parents=True, exist_ok=True)
        report = safefs.CopyReport()
        report.leave_out(".", str(e))
        return report


def left_out_note(what: str, report: safefs.CopyReport, env_type: str) -> str | None:
    """A sentence for what a copy left out (links, FIFOs, oversized files), or None."""
    if not report.left_out_count:
        return None
    more = f" (and {report.left_out_count - len(report.left_out)} more)" if report.left_out_count > len(report.left_out) else ""
    return f"{env_type}: left out of the copy of {what}: {'; '.join(report.left_out)}{more}"
