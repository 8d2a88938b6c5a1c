"""Task families: a family turns its task records into what the agent gets and grades the
submission itself (families/svg_icon: an icon graded by rendering and a vision-language judge)."""

from __future__ import annotations

from harness_env.core.errors import InvalidRequestError
from harness_env.core.grading import Grader
from harness_env.families.base import TaskFamily
from harness_env.models import RolloutRequest


def _families() -> dict[str, type]:
    from harness_env.families.svg_icon.family import SvgIconFamily

    return {"svg_icon": SvgIconFamily}


def family_names() -> list[str]:
    return sorted(_families())


def get_family(name: str) -> TaskFamily:
    cls = _families().get(name)
    if cls is None:
        raise InvalidRequestError(f"unknown task_family {name!r}; choose one of: {', '.join(family_names())}")
    return cls()


def prepare(request: RolloutRequest, *, trusted: bool) -> tuple[RolloutRequest, Grader | None]:
    """The request as its family prepares it, and the family's grader (None without a family)."""
    if not request.task_family:
        if request.family_options:
            raise InvalidRequestError("family_options given without task_family")
        return request, None
    family = get_family(request.task_family)
    prepared = family.prepare(request, trusted=trusted)
    return prepared, family.grader(prepared)


def grader_for(request: RolloutRequest) -> Grader | None:
    """The grader of a prepared request's family (None without a family)."""
    return get_family(request.task_family).grader(request) if request.task_family else None
