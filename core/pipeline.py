"""One request pipeline: what every entry point (the in-process API, the CLI, HTTP, MCP, the web
UI) does with a request before the engine runs it.

`prepare` validates the request, lets its harness prepare it (Harbor resolves its task
directory), lets its task family prepare it (the task the agent gets) and picks the family's
grader. Each step raises InvalidRequestError with a clear message; nothing runs yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from harness_env.core.capture.passthrough import check_wire_api
from harness_env.core.errors import InvalidRequestError, describe_validation_error
from harness_env.core.grading import Grader
from harness_env.core.harness import Harness, OwnsEnvironment
from harness_env.core.registry import get_family, get_harness
from harness_env.models import RolloutRequest


@dataclass(frozen=True)
class PreparedRollout:
    request: RolloutRequest  # after harness and family preparation
    harness: Harness
    grader: Grader | None  # the task family's, which replaces the verify commands


def validate(request: RolloutRequest | dict[str, Any]) -> RolloutRequest:
    if isinstance(request, RolloutRequest):
        return request
    try:
        return RolloutRequest.model_validate(request)
    except ValidationError as e:
        raise InvalidRequestError(describe_validation_error(e)) from None


def prepare(request: RolloutRequest | dict[str, Any], *, trusted: bool) -> PreparedRollout:
    """`trusted`: the caller may name server-side paths (the CLI, the in-process API); a remote
    caller may not, beyond the directories the server configures. May read task directories from
    disk: call it off the event loop."""
    request = validate(request)
    harness = get_harness(request.harness)
    if request.task.image and isinstance(harness, OwnsEnvironment):  # its environment is its own: the image would be ignored
        raise InvalidRequestError(
            f"harness {harness.name!r} runs the task in an environment of its own; a task image is for the local sandbox's harnesses: leave image out"
        )
    if harness.options_model is None and request.harness_options:
        raise InvalidRequestError(f"harness_options given, but harness {request.harness!r} takes none")
    if harness.options_model is not None:
        try:  # a request made before the registry was loaded carries them unchecked
            harness.options_model.of(request)
        except ValidationError as e:
            raise InvalidRequestError(describe_validation_error(e)) from None
    request = harness.prepare(request, trusted=trusted)
    check_wire_api(request, harness.dialect)  # the dialect it speaks (core/capture/dialects)
    if not request.task_family:
        if request.family_options:
            raise InvalidRequestError("family_options given without task_family")
        return PreparedRollout(request, harness, None)
    family = get_family(request.task_family)
    request = family.prepare(request, trusted=trusted)
    return PreparedRollout(request, harness, family.grader(request))
