"""Validation errors become one line that names where and what, never the input itself, and
always encodes (a lone surrogate in a key or a message must not turn a 422 into a 500)."""

import json

from pydantic import BaseModel, ValidationError

from harness_env.core.errors import MAX_PROBLEMS, describe_validation_error, safe_text


class _M(BaseModel):
    n: int
    names: dict[str, int] = {}


def _error(data) -> ValidationError:
    try:
        _M.model_validate(data)
    except ValidationError as e:
        return e
    raise AssertionError("valid")


def test_names_the_field_without_the_input():
    text = describe_validation_error(_error({"n": "SECRET-VALUE" * 100}))
    assert text.startswith("invalid request: n: ") and "SECRET-VALUE" not in text


def test_a_surrogate_in_a_key_is_escaped_so_the_message_encodes():
    text = describe_validation_error(_error({"n": 1, "names": {"k\ud800": "x"}}))
    assert "names.k" in text
    text.encode("utf-8")
    json.dumps(text, ensure_ascii=False).encode("utf-8")


def test_many_problems_are_cut_to_a_bounded_line():
    text = describe_validation_error(_error({"n": 1, "names": {f"k{i}": "x" for i in range(1000)}}))
    assert text.count("names.k") == MAX_PROBLEMS and text.endswith(f"and {1000 - MAX_PROBLEMS} more")


def test_safe_text():
    assert safe_text("a\udcffb", 10) == "a\\udcffb"
    assert safe_text("x" * 50, 10) == "x" * 10 + "..."
    assert safe_text("héllo 🙂", 10) == "héllo 🙂"
