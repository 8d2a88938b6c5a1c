"""The one exception hierarchy of the engine. Messages say what was wrong and what to do."""

from __future__ import annotations


class HarnessEnvError(Exception):
    """Base of every error the engine raises on purpose. `kind` maps to RolloutResult.error_kind."""

    kind: str = "internal"


class InvalidRequestError(HarnessEnvError):
    kind = "invalid_request"


class ToolMissingError(HarnessEnvError):
    """A harness CLI or runtime is not installed; the message names the install command."""

    kind = "agent_error"


class SandboxError(HarnessEnvError):
    kind = "sandbox"


class EndpointError(HarnessEnvError):
    kind = "endpoint"


MAX_PROBLEMS = 10  # per message: a thousand bad items need not make a megabyte of error


def safe_text(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, with any lone surrogate (from a bad key or value) written
    as its escape: an error message must always encode to UTF-8 and JSON."""
    if len(text) > limit:
        text = text[:limit] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def describe_validation_error(e, within: str = "") -> str:
    """A pydantic ValidationError as one line: where, and what is wrong, per problem (never the
    input itself). `within`: the field the validated value sits in (`task` for a Task checked on
    its own), so the place named is the request's."""
    errors = e.errors(include_input=False, include_url=False, include_context=False)
    parts = []
    for err in errors[:MAX_PROBLEMS]:
        loc = ".".join(safe_text(str(x), 100) for x in ((within,) if within else ()) + tuple(err.get("loc", ()))) or "request"
        parts.append(f"{loc}: {safe_text(str(err.get('msg')), 1000)}")
    if len(errors) > MAX_PROBLEMS:
        parts.append(f"and {len(errors) - MAX_PROBLEMS} more")
    return "invalid request: " + "; ".join(parts)
