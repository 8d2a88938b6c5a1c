"""Turns held packed while a rollout runs: exact ids and logprobs back, shared prompt prefixes."""

import copy
import json
import pickle
from array import array

import httpx
import pytest

from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.graph import link_turns
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.record import CallOutcome, CallRequest
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.serve import serve_on_loopback
from harness_env.core.capture.session import CaptureSession
from harness_env.core.capture.tokens import PromptIds
from harness_env.models import Endpoint, RolloutResult, Turn
from tests.fakes.policy import FakePolicy, FakePolicyServer

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "required": ["command"]}}}]
STEPS = 6


def _held_bytes(session: CaptureSession) -> int:
    """Bytes of prompt id text the session holds, each shared piece counted once."""
    pieces = {id(p): len(p) for t in session.turns if t.prompt is not None for p in t.prompt.pieces}
    return sum(pieces.values())


@pytest.mark.parametrize("stream", [True, False])
async def test_a_rollout_is_held_once_and_given_back_exactly_as_the_engine_sent_it(stream):
    policy = FakePolicy(scripts={"m": [{"bash": f"cat part{i}.txt"} for i in range(STEPS - 1)] + [{"text": "all done"}]})
    with FakePolicyServer(policy) as upstream:
        proxy = CaptureProxy()
        try:
            async with serve_on_loopback(proxy.app) as url, httpx.AsyncClient(base_url=url + "/v1", timeout=30) as client:
                session = proxy.open_session(Endpoint(base_url=upstream.base_url, api_key="sk-up-0123456789", model="m"), CapturePolicy())
                messages = [{"role": "system", "content": "You are terse. " * 200}, {"role": "user", "content": "read the parts"}]
                for step in range(STEPS):  # a harness: the whole history back each call, plus the tool's output
                    r = await client.post(
                        "/chat/completions",
                        json={"model": "x", "messages": messages, "tools": TOOLS, "stream": stream},
                        headers={"authorization": f"Bearer {session.key}"},
                    )
                    assert r.status_code == 200
                    sent = policy.sent[-1]
                    if sent.tool_calls:
                        messages = messages + [
                            {"role": "assistant", "content": None, "tool_calls": sent.tool_calls},
                            {"role": "tool", "tool_call_id": sent.tool_calls[0]["id"], "content": f"line {step}\n" * 300},
                        ]
        finally:
            await proxy.aclose()
    turns = session.sorted_turns()
    assert len(turns) == STEPS == len(policy.sent)
    for turn, sent in zip(turns, policy.sent):  # the wire's lists, exactly the engine's
        assert (turn.prompt_token_ids, turn.completion_token_ids, turn.per_token_logps) == (sent.prompt_token_ids, sent.completion_token_ids, sent.logprobs)
        assert turn.request_messages == sent.request["messages"] and turn.capture_level == "tokens"
    # Every prompt extends the one before: the session holds the last one's text about once, not
    # every turn's whole prompt.
    whole = sum(t.prompt.size for t in session.turns)
    assert _held_bytes(session) <= session.turns[-1].prompt.size * 1.05 < whole / 2
    # The history the harness resent is held once too: the same message objects, turn after turn.
    first, last = (session.turns[0], session.turns[-1])
    assert all(a is b for a, b in zip(first.request_messages, last.request_messages))
    # The graph and the training row are what the engine's own lists give.
    summary = link_turns(turns)
    truth = [
        Turn(
            index=i,
            prompt_token_ids=s.prompt_token_ids,
            completion_token_ids=s.completion_token_ids,
            per_token_logps=s.logprobs,
            upstream_status=200,
            capture_level="tokens",
        )
        for i, s in enumerate(policy.sent)
    ]
    link_turns(truth)
    assert summary.branches == 1 and [t.parent for t in turns] == [None, 0, 1, 2, 3, 4]
    (row,) = RolloutResult(proxy_turns=turns, reward=1.0).training_rows()
    (expected,) = RolloutResult(proxy_turns=truth, reward=1.0).training_rows()
    assert row.trainable and (row.token_ids, row.loss_mask, row.logprobs) == (expected.token_ids, expected.loss_mask, expected.logprobs)


@pytest.mark.parametrize(
    "layout",
    [
        '{"prompt_token_ids":[5,17,123456],"choices":[{"index":0,"message":{"content":"hi"},"token_ids":[9]}]}',  # vLLM: compact
        '{"prompt_token_ids": [5, 17, 123456], "choices": [{"index": 0, "message": {"content": "hi"}, "token_ids": [9]}]}',  # json.dumps
        '{"choices": [{"index": 0, "prompt_token_ids" :\n [ 5,\n 17, 123456 ]\n, "message": {"content": "hi"}, "token_ids": [9]}]}',  # on the choice
    ],
)
def test_prompt_ids_are_cut_from_any_layout_and_the_rest_is_parsed(layout):
    draft = TurnDraft()
    draft.add_response_body(layout.encode())
    assert draft.prompt_text == b"5,17,123456" and draft.prompt_token_ids == [5, 17, 123456]
    assert draft.fields()["completion_text"] == "hi" and draft.capture_level() == "tokens"


@pytest.mark.parametrize(
    "body",
    [
        '{"choices": [{"message": {"content": "the \\"prompt_token_ids\\": [1, 2] field"}}], "prompt_token_ids": [7, 8]}',  # key in text first
        '{"prompt_token_ids": [[1, 2]], "choices": []}',  # not a plain list: parsed as it is
        '{"prompt_token_ids": [], "choices": []}',
    ],
)
def test_odd_answers_still_give_the_engine_s_values(body):
    draft = TurnDraft()
    draft.add_response_body(body.encode())
    parsed = json.loads(body)
    expected = parsed["prompt_token_ids"]
    assert draft.prompt_token_ids == expected
    assert draft.fields()["completion_text"] == "".join((c.get("message") or {}).get("content") or "" for c in parsed["choices"])


def test_a_prompt_shares_an_earlier_one_only_at_an_id_boundary():
    base = PromptIds.extending(b"1,2,12", [])
    assert PromptIds.extending(b"1,2,123,4", [base]).pieces == (b"1,2,123,4",)  # 12 is not the start of 123
    longer = PromptIds.extending(b"1,2,12,3,4", [base])
    assert longer.pieces == (b"1,2,12", b",3,4") and longer.pieces[0] is base.pieces[0] and longer.ids() == [1, 2, 12, 3, 4]
    assert PromptIds.extending(b"1,2,12", [longer, base]) is base  # the same prompt again: nothing new held
    assert PromptIds.extending(b"1,2", [base]).pieces == (b"1,2",)  # shorter: its own text


def test_logprobs_come_back_bit_for_bit_and_big_ids_whole():
    values = [-0.1, -1.0000000000000002, -5e-324, -3.4028234663852886e38, -1.1920928955078125e-07, -0.0]
    ids = [2**31 + 5, 3, 2**40]  # beyond 32 bits: kept whole, never truncated
    body = json.dumps(
        {
            "prompt_token_ids": [1, 2],
            "choices": [{"index": 0, "message": {"content": "x"}, "token_ids": ids, "logprobs": {"content": [{"token": "t", "logprob": v} for v in values]}}],
        }
    ).encode()
    draft = TurnDraft()
    draft.add_response_body(body)
    session = CaptureSession(key="k", endpoint=Endpoint(base_url="http://127.0.0.1:9/v1", api_key="sk-0123456789", model="m"), policy=CapturePolicy())
    session.record(CallRequest(0, "policy", False, [], []), CallOutcome(200, None, 0.0), draft)
    [out] = session.sorted_turns()
    assert [v.hex() for v in out.per_token_logps] == [v.hex() for v in values]
    assert out.completion_token_ids == ids and out.prompt_token_ids == [1, 2]
    # The wire's JSON is what a Turn made from the parsed lists gives.
    assert out.model_dump_json() == Turn(index=0, upstream_status=200, **draft.fields()).model_dump_json()


def test_a_recorded_turn_reads_like_a_turn_and_copies_as_itself():
    session = CaptureSession(key="k", endpoint=Endpoint(base_url="http://127.0.0.1:9/v1", api_key="sk-0123456789", model="m"), policy=CapturePolicy())
    seen = []
    session.on_turn = seen.append
    draft = TurnDraft(prompt_text=b"1,2,3", completion_token_ids=[5, 6], per_token_logps=[-0.5, -0.25], text_parts=["hi"])
    session.record(CallRequest(4, "policy", False, [], []), CallOutcome(200, None, 0.0), draft)
    [recorded] = session.turns
    assert seen == [recorded] and (recorded.index, recorded.completion_text, recorded.prompt_token_ids) == (4, "hi", [1, 2, 3])
    for copied in (copy.copy(recorded), copy.deepcopy(recorded), pickle.loads(pickle.dumps(recorded))):
        assert type(copied) is type(recorded) and copied.to_turn() == recorded.to_turn()
    assert recorded.to_turn().completion_token_ids == [5, 6] and isinstance(recorded.completion, array)  # held packed only


def test_the_wire_lists_are_made_from_the_prompt_each_extends_and_belong_to_their_turn():
    session = CaptureSession(key="k", endpoint=Endpoint(base_url="http://127.0.0.1:9/v1", api_key="sk-0123456789", model="m"), policy=CapturePolicy())
    for i, text in enumerate([b"1,2", b"1,2,3,4", b"1,2,3,4", b"9,9", b"1,2,3,4,5"]):
        session.record(
            CallRequest(i, "policy", False, [], []), CallOutcome(200, None, 0.0), TurnDraft(prompt_text=text, completion_token_ids=[7], per_token_logps=[-1.0])
        )
    turns = session.sorted_turns()
    assert [t.prompt_token_ids for t in turns] == [[1, 2], [1, 2, 3, 4], [1, 2, 3, 4], [9, 9], [1, 2, 3, 4, 5]]
    turns[1].prompt_token_ids.append(99)  # a consumer changing one turn's list changes no other's
    assert turns[2].prompt_token_ids == [1, 2, 3, 4] and turns[4].prompt_token_ids == [1, 2, 3, 4, 5]
    assert session.sorted_turns()[1].prompt_token_ids == [1, 2, 3, 4]
