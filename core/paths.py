"""Server-side paths a remote caller may name: only under a directory the operator configured."""

from __future__ import annotations

import os
from pathlib import Path

from harness_env.core.errors import InvalidRequestError

NAME_MAX = 255  # Linux's limits: bytes in one name,
PATH_MAX = 4096  # and in a whole path


def _as_path(path: str, what: str, *, expand_home: bool) -> Path:
    """`path` as a Path, or one InvalidRequestError for what the OS cannot name: a NUL byte, a lone
    surrogate, a name or path over Linux's length limits, or `~user` for a user this machine does
    not have."""
    if "\x00" in path:
        raise InvalidRequestError(f"{what} {path!r} contains a NUL byte; name a directory path")
    try:
        path.encode()
    except UnicodeEncodeError:
        raise InvalidRequestError(f"{what} {path!r} is not valid UTF-8; name a directory path") from None
    p = Path(path)
    # Checking a longer name would raise ENAMETOOLONG from the first stat, not a clear error.
    if len(os.fsencode(path)) > PATH_MAX or any(len(os.fsencode(part)) > NAME_MAX for part in p.parts):
        raise InvalidRequestError(f"{what} {path[:80]!r}... is too long: at most {NAME_MAX} bytes a name and {PATH_MAX} in all; name a directory path")
    if not expand_home:
        return p
    try:
        return p.expanduser()
    except RuntimeError:
        raise InvalidRequestError(f"{what} {path!r} starts with ~ but that home directory is unknown here") from None


def confined_path(path: str, root_var: str, what: str, *, trusted: bool) -> Path:
    """`path` resolved. A trusted caller (CLI, in-process) may name any path; a remote one only a
    path under $`root_var` (relative paths are relative to it), so a request cannot read the
    server's other files. A remote `~` is a literal name: the server's home is not the caller's."""
    p = _as_path(path, what, expand_home=trusted)
    if trusted:
        return p.resolve()
    root = os.environ.get(root_var)
    if not root:
        raise InvalidRequestError(f"{what} paths are read on the server only under ${root_var}, which is not set here")
    base = Path(root).expanduser().resolve()
    p = (base / p).resolve() if not p.is_absolute() else p.resolve()
    if not p.is_relative_to(base):
        raise InvalidRequestError(f"{what} must lie under ${root_var} ({root})")
    return p
