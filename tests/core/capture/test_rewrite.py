import json

from harness_env.core.capture.rewrite import CapturePolicy, EndpointQuirks, learn_from_rejection, rewrite_request

BODY = {"model": "client-name", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_completion_tokens": 4096}


def test_transparent_mode_asks_for_exact_data():
    out, added = rewrite_request(BODY, CapturePolicy(top_logprobs=3), EndpointQuirks(), "real-model")
    assert out["model"] == "real-model"
    assert out["logprobs"] is True and out["top_logprobs"] == 3 and out["return_token_ids"] is True
    assert added == {"logprobs", "top_logprobs", "return_token_ids"}
    assert BODY.get("logprobs") is None  # the harness's body is not mutated


def test_black_box_asks_for_nothing_extra_but_applies_policy():
    out, added = rewrite_request(BODY, CapturePolicy(capture=False, max_tokens_cap=100, disable_thinking=True), EndpointQuirks(), "m")
    assert "logprobs" not in out and "return_token_ids" not in out
    assert out["max_completion_tokens"] == 100
    assert out["chat_template_kwargs"] == {"enable_thinking": False}
    assert added == {"chat_template_kwargs"}


def test_cap_sets_max_tokens_when_harness_sent_none():
    out, _ = rewrite_request({"messages": []}, CapturePolicy(max_tokens_cap=50), EndpointQuirks(), "m")
    assert out["max_tokens"] == 50
    out, _ = rewrite_request({"messages": [], "max_tokens": 10}, CapturePolicy(max_tokens_cap=50), EndpointQuirks(), "m")
    assert out["max_tokens"] == 10


def test_openai_unknown_field_rejection_is_learned():
    q = EndpointQuirks()
    _, added = rewrite_request(BODY, CapturePolicy(), q, "m")
    err = json.dumps({"error": {"message": "Unrecognized request argument supplied: return_token_ids", "type": "invalid_request_error", "param": None, "code": None}}).encode()
    assert learn_from_rejection(400, err, added, q) == "return_token_ids"
    out, added = rewrite_request(BODY, CapturePolicy(), q, "m")
    assert "return_token_ids" not in out and out["logprobs"] is True


def test_max_tokens_rename_is_learned():
    q = EndpointQuirks()
    body = {"messages": [], "max_tokens": 99}
    _, added = rewrite_request(body, CapturePolicy(), q, "m")
    err = json.dumps({"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.", "param": "max_tokens", "code": "unsupported_parameter"}}).encode()
    assert learn_from_rejection(400, err, added, q) == "max_tokens->max_completion_tokens"
    out, _ = rewrite_request(body, CapturePolicy(), q, "m")
    assert "max_tokens" not in out and out["max_completion_tokens"] == 99


def test_unrelated_errors_are_not_learned():
    q = EndpointQuirks()
    assert learn_from_rejection(400, b'{"error": {"message": "context length exceeded"}}', {"logprobs"}, q) is None
    assert learn_from_rejection(500, b"return_token_ids", {"return_token_ids"}, q) is None
    assert learn_from_rejection(400, b"bad return_token_ids", set(), q) is None  # the harness's own field
    assert q.dropped == set()


def test_the_rollout_temperature_overrides_the_harness():
    out, _ = rewrite_request({**BODY, "temperature": 0.2}, CapturePolicy(temperature=1.0), EndpointQuirks(), "m")
    assert out["temperature"] == 1.0
    out, _ = rewrite_request({**BODY, "temperature": 0.2}, CapturePolicy(), EndpointQuirks(), "m")
    assert out["temperature"] == 0.2
