"""Server-side paths a remote caller may name: only under a directory the operator configured."""

from __future__ import annotations

import os
from pathlib import Path

from harness_env.core.errors import InvalidRequestError


def confined_path(path: str, root_var: str, what: str, *, trusted: bool) -> Path:
    """`path` resolved. A trusted caller (CLI, in-process) may name any path; a remote one only a
    path under $`root_var` (relative paths are relative to it), so a request cannot read the
    server's other files."""
    p = Path(path).expanduser()
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
