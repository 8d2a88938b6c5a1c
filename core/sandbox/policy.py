"""A request's sandbox limits, checked against the server's maximums.

Each limit is a rollout option (models.RolloutOptions: memory_limit_mb, pids_limit, disk_limit_mb,
cpu_limit) whose default suits a coding agent; an operator caps what callers may ask for with
HARNESS_ENV_MAX_<OPTION> (e.g. HARNESS_ENV_MAX_MEMORY_LIMIT_MB=8192).
"""

from __future__ import annotations

import os

from harness_env.core.errors import InvalidRequestError
from harness_env.core.sandbox.limits import Limits
from harness_env.models import RolloutOptions

LIMIT_FIELDS = ("memory_limit_mb", "pids_limit", "disk_limit_mb", "cpu_limit")


def server_maximum(field: str, env: dict[str, str] | None = None) -> float | None:
    raw = (os.environ if env is None else env).get(f"HARNESS_ENV_MAX_{field.upper()}")
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise InvalidRequestError(f"the server's HARNESS_ENV_MAX_{field.upper()}={raw!r} is not a number; fix the server's environment") from None


def sandbox_limits(options: RolloutOptions, env: dict[str, str] | None = None) -> Limits:
    """The Limits of a rollout (with its task's image, given a RolloutRequest); a value over the
    server's maximum is one clear error."""
    for field in LIMIT_FIELDS:
        cap = server_maximum(field, env)
        value = getattr(options, field)
        if cap is not None and (value is None or value > cap):
            asked = "no cap" if value is None else f"{value:g}"
            raise InvalidRequestError(f"{field}={asked} is over this server's maximum of {cap:g}; ask for at most {cap:g}")
    mib = 1024**2
    return Limits(
        memory_bytes=options.memory_limit_mb * mib,
        pids=options.pids_limit,
        cpu_cores=options.cpu_limit,
        disk_bytes=options.disk_limit_mb * mib,
        image=getattr(getattr(options, "task", None), "image", None),  # a RolloutRequest's task
    )
