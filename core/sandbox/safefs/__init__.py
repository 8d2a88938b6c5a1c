"""Reading back, writing, removing and copying what a sandbox holds, treating every name in it as
hostile.

The agent controls the tree: a file can be a symlink to a host file, a FIFO that blocks any
`open()`, a 2 GB file, or the bottom of a directory chain 5,000 levels deep. So every path is
walked one component at a time from a directory descriptor the caller trusts, with O_NOFOLLOW
(a link is never followed), files are opened O_NONBLOCK and kept only when fstat says they are
regular files, reads are bounded, and removal is iterative (no recursion limit, no PATH_MAX).
These are blocking calls: run them off the event loop (asyncio.to_thread).

Modules: descend (walking a path, what an entry is), read (bounded reads and walks), listing
(ls and glob for the white-box file tools), write (replacing a file, never writing through it),
remove (any tree the agent made), copy (bounded copies out of and into a sandbox).
"""

from harness_env.core.sandbox.safefs.copy import CopyReport, copy_file_out, copy_in, copy_out
from harness_env.core.sandbox.safefs.descend import UnsafeEntry, kind_of, open_dir
from harness_env.core.sandbox.safefs.listing import DirEntry, GlobResult, glob, scan_dir
from harness_env.core.sandbox.safefs.read import FoundFile, file_size, open_regular, read_regular, stat_entry, walk_files
from harness_env.core.sandbox.safefs.remove import remove_tree
from harness_env.core.sandbox.safefs.write import write_regular

__all__ = [
    "CopyReport",
    "DirEntry",
    "FoundFile",
    "GlobResult",
    "UnsafeEntry",
    "copy_file_out",
    "copy_in",
    "copy_out",
    "file_size",
    "glob",
    "kind_of",
    "open_dir",
    "open_regular",
    "read_regular",
    "remove_tree",
    "scan_dir",
    "stat_entry",
    "walk_files",
    "write_regular",
]
