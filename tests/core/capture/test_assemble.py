import json

from harness_env.core.capture.assemble import TurnDraft


def _chunk(**choice):
    return json.dumps({"object": "chat.completion.chunk", "choices": [{"index": 0, **choice}]})


def test_streaming_tool_call_tokens_and_logprobs():
    d = TurnDraft()
    d.add_chunk_text(json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "prompt_token_ids": [1, 2, 3]}))
    d.add_chunk_text(
        _chunk(
            delta={"content": "Hi"},
            token_ids=[10],
            logprobs={"content": [{"token": "Hi", "logprob": -0.5, "top_logprobs": [{"token": "Hi", "logprob": -0.5}, {"token": "Yo", "logprob": -2.0}]}]},
        )
    )
    d.add_chunk_text(_chunk(delta={"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "bash", "arguments": ""}}]}))
    d.add_chunk_text(
        _chunk(
            delta={"tool_calls": [{"index": 0, "function": {"arguments": '{"command":'}}]},
            token_ids=[11, 12],
            logprobs={"content": [{"token": "a", "logprob": -0.1}, {"token": "b", "logprob": -0.2}]},
        )
    )
    d.add_chunk_text(
        _chunk(
            delta={"tool_calls": [{"index": 0, "function": {"arguments": ' "ls"}'}}]}, token_ids=[13], logprobs={"content": [{"token": "c", "logprob": -0.3}]}
        )
    )
    d.add_chunk_text(_chunk(delta={}, finish_reason="tool_calls"))
    d.add_chunk_text(json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}))
    d.add_chunk_text("[DONE]")
    f = d.fields()
    assert f["prompt_token_ids"] == [1, 2, 3]
    assert f["completion_token_ids"] == [10, 11, 12, 13]
    assert f["per_token_logps"] == [-0.5, -0.1, -0.2, -0.3]
    assert f["completion_text"] == "Hi"
    assert f["tool_calls"] == [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]
    assert f["finish_reason"] == "tool_calls"
    assert f["usage"] == {"prompt_tokens": 3, "completion_tokens": 4}
    assert [t.token for t in f["top_logprobs"][0]] == ["Hi", "Yo"]
    assert f["capture_level"] == "tokens"
    assert d.errors == []


def test_malformed_chunk_is_recorded_not_fatal():
    d = TurnDraft()
    d.add_chunk_text('{"choices": [{"index": 0, "delta": {"content": "ok"}}]}')
    d.add_chunk_text('{"choices": [ broken')
    d.add_chunk_text("[1, 2]")
    assert d.fields()["completion_text"] == "ok"
    assert len(d.errors) == 2 and "malformed" in d.errors[0]


def test_non_streaming_response():
    d = TurnDraft()
    d.add_response(
        {
            "prompt_token_ids": [5, 6],
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "x",
                        "reasoning_content": "think",
                        "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                    },
                    "token_ids": [7],
                    "logprobs": {"content": [{"token": "x", "logprob": -1.0}]},
                    "finish_reason": "stop",
                }
            ],
        }
    )
    f = d.fields()
    assert (f["prompt_token_ids"], f["completion_token_ids"], f["per_token_logps"]) == ([5, 6], [7], [-1.0])
    assert f["reasoning_text"] == "think" and f["tool_calls"][0]["function"]["name"] == "f"


def test_token_id_strings_give_exact_ids_when_no_token_ids_field():
    d = TurnDraft()
    d.add_response(
        {
            "prompt_token_ids": [1],
            "choices": [
                {"message": {"content": "ab"}, "logprobs": {"content": [{"token": "token_id:42", "logprob": -0.1}, {"token": "token_id:7", "logprob": -0.2}]}}
            ],
        }
    )
    assert d.fields()["completion_token_ids"] == [42, 7]


def test_capture_levels_never_fill_missing_data():
    text_only = TurnDraft()
    text_only.add_response({"choices": [{"message": {"content": "hello"}}]})
    f = text_only.fields()
    assert f["capture_level"] == "text"
    assert f["prompt_token_ids"] == [] and f["completion_token_ids"] == [] and f["per_token_logps"] == []
    lp = TurnDraft()
    lp.add_response({"choices": [{"message": {"content": "h"}, "logprobs": {"content": [{"token": "h", "logprob": -0.3}]}}]})
    assert lp.fields()["capture_level"] == "logprobs"
    assert lp.fields()["completion_token_ids"] == []


def test_a_logprob_that_is_not_a_number_leaves_the_turns_logprobs_out_and_breaks_nothing():
    """vLLM past a model's positions streams `"logprob": null` (NaN): the ids are kept, no number is
    made up, the error says why (the recording once died on it and the turn was lost)."""
    d = TurnDraft()
    d.add_chunk_text(json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "prompt_token_ids": [1, 2]}))
    d.add_chunk_text(_chunk(delta={"content": "a"}, token_ids=[10], logprobs={"content": [{"token": "a", "logprob": -0.5, "top_logprobs": []}]}))
    d.add_chunk_text(
        _chunk(
            delta={"content": "b"},
            token_ids=[11],
            logprobs={"content": [{"token": "b", "logprob": None, "top_logprobs": [{"token": "b", "logprob": None}, {"token": "c", "logprob": -1.0}]}]},
        )
    )
    d.add_chunk_text(_chunk(delta={}, finish_reason="stop"))
    f = d.fields()
    assert f["completion_token_ids"] == [10, 11] and f["completion_text"] == "ab"
    assert f["per_token_logps"] == [] and f["top_logprobs"] == []
    assert len(d.errors) == 1 and "not a finite number (None) at completion token 1" in d.errors[0]


def test_a_recorded_streams_bytes_are_read_as_its_decoded_text_is():
    # The chat relay reads its copy of the stream as bytes (add_chunk_bytes); whatever the payloads,
    # the turn is the one their decoded text gives (add_chunk_text).
    ids = json.dumps({"choices": [{"index": 0, "delta": {"content": ""}}], "prompt_token_ids": [5, 6, 7]})
    payloads = [
        ids.encode(),
        _chunk(delta={"content": "é"}, token_ids=[1], logprobs={"content": [{"token": "é", "logprob": -0.25}]}).encode(),
        b" [DONE] ",
        b'{"choices": [{"index": 0, "delta": {"content": "\xff"}}]}',  # not UTF-8
        b'{"prompt_token_ids": [1, 2], "choices": [',  # malformed, holding the key
        b"[1, 2]",
        b'{"choices": [{"index": 0, "delta": {"content": "\\ud800"}, "finish_reason": "stop"}]}',  # a lone surrogate
        b"[DONE]",
    ]
    for first in range(len(payloads)):  # each payload also as the first (the one whose ids are cut)
        order = payloads[first:] + payloads[:first]
        as_bytes, as_text = TurnDraft(), TurnDraft()
        for p in order:
            as_bytes.add_chunk_bytes(p)
            as_text.add_chunk_text(p.decode("utf-8", errors="replace"))
        assert as_bytes == as_text and as_bytes.prompt_text == as_text.prompt_text, first
