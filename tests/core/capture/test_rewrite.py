import json

import pytest

from harness_env.core.capture.rewrite import (
    ENGINE_FIELDS,
    MAX_TOKENS_CEILING,
    CapturePolicy,
    EndpointQuirks,
    learn_from_rejection,
    may_name_an_added_field,
    rewrite_request,
)

BODY = {"model": "client-name", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_completion_tokens": 4096}


def test_transparent_mode_asks_for_exact_data():
    out, added, _ = rewrite_request(BODY, CapturePolicy(top_logprobs=3), EndpointQuirks(), "real-model")
    assert out["model"] == "real-model"
    assert out["logprobs"] is True and out["top_logprobs"] == 3 and out["return_token_ids"] is True
    assert added == {"logprobs", "top_logprobs", "return_token_ids"}
    assert BODY.get("logprobs") is None  # the harness's body is not mutated


@pytest.mark.parametrize("plain", [False, True])
def test_plain_sampling_drops_what_reshapes_the_distribution_beyond_temperature(plain):
    """Gemini CLI sends top_p 0.95: vLLM's processed logprobs are then after nucleus truncation
    (5e-2 off teacher forcing against the real engine). Under plain_sampling they are not."""
    body = {**BODY, "top_p": 0.95, "presence_penalty": 0.5, "frequency_penalty": 0.1, "temperature": 0.7, "seed": 3}
    out, _, dropped = rewrite_request(body, CapturePolicy(plain_sampling=plain), EndpointQuirks(), "m")
    shapers = {"top_p", "presence_penalty", "frequency_penalty"}
    assert (shapers & set(out)) == (set() if plain else shapers)
    assert (shapers <= dropped) is plain
    assert out["temperature"] == 0.7 and out["seed"] == 3  # temperature is the trainer's to match; a seed reshapes nothing


def test_structured_outputs_only_on_calls_the_rollout_constrains():
    policy = CapturePolicy(structured_regex="a|b")
    assert rewrite_request(BODY, policy, EndpointQuirks(), "m", constrained=True)[0]["structured_outputs"] == {"regex": "a|b"}
    assert "structured_outputs" not in rewrite_request(BODY, policy, EndpointQuirks(), "m")[0]


def test_black_box_asks_for_nothing_extra_but_applies_policy():
    out, added, _ = rewrite_request(BODY, CapturePolicy(capture=False, max_tokens_cap=100, disable_thinking=True), EndpointQuirks(), "m")
    assert "logprobs" not in out and "return_token_ids" not in out
    assert out["max_completion_tokens"] == 100
    assert out["chat_template_kwargs"] == {"enable_thinking": False}
    assert added == {"chat_template_kwargs"}


def test_cap_sets_max_tokens_when_harness_sent_none():
    out, _, _ = rewrite_request({"messages": []}, CapturePolicy(max_tokens_cap=50), EndpointQuirks(), "m")
    assert out["max_tokens"] == 50
    out, _, _ = rewrite_request({"messages": [], "max_tokens": 10}, CapturePolicy(max_tokens_cap=50), EndpointQuirks(), "m")
    assert out["max_tokens"] == 10


def test_openai_unknown_field_rejection_is_learned():
    q = EndpointQuirks()
    _, added, _ = rewrite_request(BODY, CapturePolicy(), q, "m")
    err = json.dumps(
        {"error": {"message": "Unrecognized request argument supplied: return_token_ids", "type": "invalid_request_error", "param": None, "code": None}}
    ).encode()
    assert learn_from_rejection(400, err, added, q) == "return_token_ids"
    out, added, _ = rewrite_request(BODY, CapturePolicy(), q, "m")
    assert "return_token_ids" not in out and out["logprobs"] is True


def test_max_tokens_rename_is_learned():
    q = EndpointQuirks()
    body = {"messages": [], "max_tokens": 99}
    _, added, _ = rewrite_request(body, CapturePolicy(), q, "m")
    err = json.dumps(
        {
            "error": {
                "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
                "param": "max_tokens",
                "code": "unsupported_parameter",
            }
        }
    ).encode()
    assert learn_from_rejection(400, err, added, q) == "max_tokens->max_completion_tokens"
    out, _, _ = rewrite_request(body, CapturePolicy(), q, "m")
    assert "max_tokens" not in out and out["max_completion_tokens"] == 99


def test_unrelated_errors_are_not_learned():
    q = EndpointQuirks()
    assert learn_from_rejection(400, b'{"error": {"message": "context length exceeded"}}', {"logprobs"}, q) is None
    assert learn_from_rejection(500, b"return_token_ids", {"return_token_ids"}, q) is None
    assert learn_from_rejection(400, b"bad return_token_ids", set(), q) is None  # the harness's own field
    assert q.dropped == set()


def test_the_rollout_temperature_overrides_the_harness():
    out, _, _ = rewrite_request({**BODY, "temperature": 0.2}, CapturePolicy(temperature=1.0), EndpointQuirks(), "m")
    assert out["temperature"] == 1.0
    out, _, _ = rewrite_request({**BODY, "temperature": 0.2}, CapturePolicy(), EndpointQuirks(), "m")
    assert out["temperature"] == 0.2


# -- only allowed, bounded fields reach the engine (issue 25: engine parameters) --------------------
HOSTILE_FIELDS = {
    "n": 64,
    "best_of": 64,
    "min_tokens": 100_000,
    "ignore_eos": True,
    "prompt_logprobs": 20,
    "logit_bias": {"1": 100},
    "top_k": 1,
    "min_p": 0.9,
    "repetition_penalty": 5,
    "use_beam_search": True,
    "echo": True,
    "chat_template": "{{ x }}",
    "add_generation_prompt": False,
    "continue_final_message": True,
    "allowed_token_ids": [1],
    "guided_regex": ".*",
    "structured_outputs": {"regex": ".*"},
    "priority": -100,
    "vllm_xargs": {"x": 1},
    "kv_transfer_params": {},
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    "user": "u",
    "unknown_field": 1,
}


def test_fields_off_the_allow_list_never_reach_the_engine():
    body = {**BODY, **HOSTILE_FIELDS}
    out, _, dropped = rewrite_request(body, CapturePolicy(), EndpointQuirks(), "m")
    assert set(out) <= {*ENGINE_FIELDS, "model", "logprobs", "return_token_ids"}
    assert out["stream_options"] == {"include_usage": True}  # only what a harness needs of it
    assert dropped == set(HOSTILE_FIELDS) - {"stream_options"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", "x"),
        ("max_tokens", True),
        ("max_tokens", 0),
        ("temperature", "logprobs"),
        ("temperature", 1e9),
        ("top_p", 0),
        ("seed", 2**70),
        ("stop", ["s"] * 100),
        ("stop", "x" * 5000),
        ("n", 2),
        ("presence_penalty", float("nan")),
        ("response_format", {"type": "json_schema", "schema": {"d": "x" * 70_000}}),
        ("tool_choice", "anything"),
        ("chat_template_kwargs", {"add_generation_prompt": False}),
        ("reasoning_effort", "x" * 100),
        ("messages", "x"),
    ],
)
def test_values_out_of_bounds_are_dropped_not_sent(field, value):
    out, _, dropped = rewrite_request({"messages": [], field: value}, CapturePolicy(), EndpointQuirks(), "m")
    assert field not in out or field == "messages" and out[field] is not value
    assert field in dropped


def test_bounded_values_pass_and_max_tokens_is_capped():
    body = {
        "messages": [],
        "n": 1,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 3,
        "stop": ["</s>"],
        "tool_choice": "auto",
        "max_tokens": 10**7,
        "chat_template_kwargs": {"enable_thinking": True, "add_generation_prompt": False},
    }
    out, _, dropped = rewrite_request(body, CapturePolicy(capture=False), EndpointQuirks(), "m")
    assert out == {**body, "model": "m", "max_tokens": MAX_TOKENS_CEILING, "chat_template_kwargs": {"enable_thinking": True}}
    assert dropped == set()
    out, _, _ = rewrite_request(body, CapturePolicy(max_tokens_cap=64), EndpointQuirks(), "m")
    assert out["max_tokens"] == 64


def test_the_rollouts_settings_win_over_the_harness():
    body = {
        "messages": [],
        "temperature": 0.2,
        "top_logprobs": 20,
        "logprobs": False,
        "return_token_ids": False,
        "chat_template_kwargs": {"enable_thinking": True},
        "max_completion_tokens": 999,
    }
    policy = CapturePolicy(top_logprobs=2, temperature=1.0, disable_thinking=True, max_tokens_cap=100)
    out, _, _ = rewrite_request(body, policy, EndpointQuirks(), "m")
    assert (out["temperature"], out["top_logprobs"], out["logprobs"], out["return_token_ids"]) == (1.0, 2, True, True)
    assert out["chat_template_kwargs"] == {"enable_thinking": False} and out["max_completion_tokens"] == 100
    out, _, dropped = rewrite_request(body, CapturePolicy(capture=False), EndpointQuirks(), "m")  # black_box asks for nothing
    assert "logprobs" not in out and "top_logprobs" not in out and "return_token_ids" not in out
    assert {"logprobs", "top_logprobs", "return_token_ids"} <= dropped


def test_a_rejection_quoting_our_fields_is_only_a_reason_to_probe():
    q = EndpointQuirks()
    _, added, _ = rewrite_request(BODY, CapturePolicy(top_logprobs=2), q, "m")
    quoted = json.dumps({"object": "error", "message": "Input should be a valid number, 'input': 'logprobs'", "param": "logprobs"}).encode()
    assert may_name_an_added_field(400, quoted, added, q)
    assert q.dropped == set() and not q.use_max_completion_tokens  # nothing learned from it


def test_the_engine_fields_are_named_in_one_place():
    """request_guard checks the types of fields the engine may get or the rollout adds: a name
    there that the allow-list does not know would be a check of nothing."""
    from harness_env.core.capture import request_guard, rewrite

    assert set(request_guard.ENGINE_FIELD_TYPES) <= set(rewrite.ENGINE_FIELDS) | set(rewrite.ADDED_FIELDS)
    assert not hasattr(request_guard, "ENGINE_FIELDS")  # one name, one meaning
