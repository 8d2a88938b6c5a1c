"""A RolloutResult always reaches its reader: made serialisable when it is not.

A result carries what a hostile sandbox and policy produced (turns, files, logs, grading). What
cannot be encoded (a lone UTF-16 surrogate slipped in somewhere) must not cost the caller the
result, or leave a job without an end: a copy with every lone surrogate made U+FFFD is given
instead, and if even that does not serialise, the result without its data, failed with why.
"""

from __future__ import annotations

from harness_env.core.capture.fastjson import valid_unicode
from harness_env.core.errors import safe_text
from harness_env.models import RolloutResult


def serialisation_error(result: RolloutResult) -> Exception | None:
    """Why `result` does not serialise to JSON, or None if it does."""
    try:
        result.model_dump_json()
    except Exception as e:  # pydantic's serialisation errors have no common base worth naming
        return e
    return None


def made_serialisable(result: RolloutResult) -> RolloutResult:
    """`result` if it serialises; else its repaired copy; else `failed_copy` saying why."""
    problem = serialisation_error(result)
    if problem is None:
        return result
    repaired = repaired_copy(result)
    return repaired if repaired is not None else failed_copy(result, f"the result could not be serialised ({describe(problem)})")


def repaired_copy(result: RolloutResult) -> RolloutResult | None:
    """A copy of a `result` that does not serialise, with its lone surrogates made U+FFFD; None if
    `result` serialises as it is, or if no such copy does."""
    if serialisation_error(result) is None:
        return None
    try:
        repaired = RolloutResult.model_validate(valid_unicode(result.model_dump()))
    except Exception:  # a copy that does not validate: there is no repairing it
        return None
    return repaired if serialisation_error(repaired) is None else None


def failed_copy(result: RolloutResult, why: str) -> RolloutResult:
    """`result`'s identity without its data, failed as an internal error: `why`, and what to do."""
    return RolloutResult(
        rollout_id=result.rollout_id,
        task_id=valid_unicode(result.task_id),
        harness=valid_unicode(result.harness),
        mode=result.mode,
        wall_s=result.wall_s,
        served_by=result.served_by,
        error_kind="internal",
        reward=None,
        error=f"internal error: {why}; its data is lost, run the rollout again",
    )


def describe(e: BaseException) -> str:
    return safe_text(f"{type(e).__name__}: {e}", 300)
