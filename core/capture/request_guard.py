"""What a harness's request must be before the proxy acts on it: one clear 400, never a 500.

The harness is driven by the policy, so every request body is hostile. Three steps, each raising
InvalidRequestError (answered 400 in the dialect's own error shape) with what was wrong:
1. `parse_body`: JSON, an object, nested at most fastjson.MAX_DEPTH deep (checked before any
   recursion) and at most MAX_RECORDED_DEPTH (what a turn's record can hold), no lone surrogate
   anywhere: what could not be serialised into the rollout's result is refused here.
2. `read_request`: the top-level fields have the types the dialect reads (its `request_shape`), and a
   shape its reader did not expect deeper down (a string where it iterates blocks, ...) is a 400
   naming the reader's complaint, not a crash.
3. `engine_body`: the chat-completions body every dialect is translated to has the types the
   proxy's own rewriting reads (ENGINE_FIELD_TYPES), whatever the dialect, and its messages'
   content parts are text or inline media only (core/capture/content_parts.py): nothing in it
   makes the engine fetch a URL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from harness_env.core.capture import content_parts, fastjson
from harness_env.core.capture.dialects.chat import ChatCompletions
from harness_env.core.errors import InvalidRequestError, safe_text

if TYPE_CHECKING:
    from harness_env.core.capture.asgi import Scope
    from harness_env.core.capture.dialects import ChatRequest, Dialect
    from harness_env.core.capture.dialects.sampled import SampledArguments

RECORD_DEPTH = 16  # a request's messages sit 5 levels down in a stored result: room to spare
MAX_RECORDED_DEPTH = 255 - RECORD_DEPTH  # orjson's and pydantic's serialisers stop at 255
Types = tuple[type, ...]
OBJECT: Types = (dict,)
LIST: Types = (list,)
BOOL: Types = (bool,)
INT: Types = (int,)
NUMBER: Types = (int, float)

# The types of what the proxy itself reads or rewrites in the engine's chat-completions body, before
# rewrite.ENGINE_FIELDS (the allow-list of what the engine gets, each field's check) and the fields
# the rollout adds (rewrite.ADDED_FIELDS): every name here is one of theirs.
ENGINE_FIELD_TYPES: dict[str, Types] = {
    "messages": LIST,
    "tools": LIST,
    "stream": BOOL,
    "stream_options": OBJECT,
    "max_tokens": INT,
    "max_completion_tokens": INT,
    "logprobs": BOOL,
    "top_logprobs": INT,
    "return_token_ids": BOOL,
    "chat_template_kwargs": OBJECT,
    "temperature": NUMBER,
    "n": INT,
}
TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", bool: "true or false", int: "an integer", float: "a number"}
# What a reader raises when a value deeper down has a shape it did not expect.
SHAPE_ERRORS = (TypeError, AttributeError, KeyError, IndexError, ValueError)


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as an object, or InvalidRequestError saying why not."""
    try:
        body = fastjson.loads_strict(raw)
    except fastjson.LoneSurrogateError as e:
        raise InvalidRequestError(f"request body is not valid Unicode: {e}; send UTF-8 text (a surrogate pair, not half of one)") from None
    except fastjson.JSONDepthError as e:
        raise InvalidRequestError(f"request body is {e}; flatten it") from None
    except ValueError as e:
        raise InvalidRequestError(f"request body is not JSON: {safe_text(str(e), 200)}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError(f"request body must be a JSON object, not {_kind(body)}")
    check_recordable(body)
    return body


def check_recordable(body: dict[str, Any]) -> None:
    """The body's messages and tools go into the turn record, RECORD_DEPTH levels down in a stored
    result, whose encoders stop at 255 levels: a body that could not be stored is refused now
    (orjson's own walk, at C speed, wrapped as deep as the record will be)."""
    wrapped: Any = body
    for _ in range(RECORD_DEPTH):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError as e:
        raise InvalidRequestError(
            f"request body is nested deeper than the {MAX_RECORDED_DEPTH} levels a turn's record can hold ({safe_text(str(e), 100)}); flatten it"
        ) from None


def check_fields(body: dict[str, Any], fields: dict[str, Types], where: str) -> None:
    """Each of `fields` in `body` is null or one of its types (a bool is not an integer here)."""
    for name, types in fields.items():
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            wanted = "a number" if types == NUMBER else " or ".join(TYPE_NAMES[t] for t in types)
            raise InvalidRequestError(f"{where}field {name!r} must be {wanted}, not {_kind(value)}")
    for name in ("messages", "tools"):
        value = body.get(name)
        if name in fields and isinstance(value, list):
            for i, item in enumerate(value):
                if not isinstance(item, dict):
                    raise InvalidRequestError(f"{where}{name}[{i}] must be an object, not {_kind(item)}")


def read_request(dialect: Dialect, body: dict[str, Any], scope: Scope, sampled: SampledArguments | None = None) -> ChatRequest:
    """The dialect's neutral view of a checked body; InvalidRequestError for any shape it cannot read."""
    shape = dialect.request_shape
    for name in shape.required:
        if body.get(name) is None:
            raise InvalidRequestError(f"field {name!r} is required")
    check_fields(body, shape.fields, "")
    try:
        request = dialect.read_request(body, scope, sampled)
    except SHAPE_ERRORS as e:
        raise InvalidRequestError(f"request body has a value of an unexpected shape ({_complaint(e)}); see the {dialect.name} API") from None
    if not all(isinstance(m, dict) for m in request.messages) or not all(isinstance(t, dict) for t in request.tools):
        raise InvalidRequestError("request messages and tools must be objects")
    return request


def engine_body(dialect: Dialect, request: ChatRequest) -> dict[str, Any]:
    """The chat-completions body for the engine, its fields of the types the proxy rewrites."""
    try:
        body = dialect.engine_body(request)
    except SHAPE_ERRORS as e:
        raise InvalidRequestError(f"request body has a value of an unexpected shape ({_complaint(e)}); see the {dialect.name} API") from None
    where = "" if dialect.name == ChatCompletions.name else "as translated to chat completions, "  # the engine's own API
    check_fields(body, ENGINE_FIELD_TYPES, where)
    if isinstance(body.get("messages"), list):
        body = {**body, "messages": content_parts.checked_messages(body["messages"], where, dialect.request_shape.inline_media)}
    return body


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return TYPE_NAMES.get(type(value), type(value).__name__)


def _complaint(e: BaseException) -> str:
    return safe_text(f"{type(e).__name__}: {e}", 200)
