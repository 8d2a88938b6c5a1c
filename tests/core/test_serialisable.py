"""A result that cannot be encoded is repaired (its data kept, lone surrogates made U+FFFD), and
one that serialises is left as it is."""

from harness_env.core.serialisable import failed_copy, made_serialisable, repaired_copy
from harness_env.models import RolloutResult, Turn


def test_a_result_that_serialises_is_the_same_object():
    result = RolloutResult(rollout_id="r1", files={"a.txt": "\U0001f600"})
    assert made_serialisable(result) is result and repaired_copy(result) is None


def test_lone_surrogates_anywhere_are_made_valid_and_the_rest_kept():
    turn = Turn(index=0, request_tools=[{"function": {"name": "\udfff"}}], completion_text="a\ud800b", completion_token_ids=[1, 2])
    result = RolloutResult(
        rollout_id="r1", reward=1.0, files={"bad\udcffname": "x\udfff"}, agent_final_text="\udc80", proxy_turns=[turn], grading={"\ud800": ["\ud83d\ude00"]}
    )
    fixed = made_serialisable(result)
    fixed.model_dump_json()
    assert fixed.files == {"bad\ufffdname": "x\ufffd"} and fixed.agent_final_text == "\ufffd"
    assert fixed.grading == {"\ufffd": ["\U0001f600"]}  # a pair written as two code points is its character
    assert fixed.proxy_turns[0].request_tools == [{"function": {"name": "\ufffd"}}]
    assert fixed.proxy_turns[0].completion_text == "a\ufffdb" and fixed.proxy_turns[0].completion_token_ids == [1, 2]
    assert fixed.reward == 1.0 and fixed.error is None


def test_a_failed_copy_says_why_and_what_to_do():
    failed = failed_copy(RolloutResult(rollout_id="r1", task_id="t", reward=1.0, files={"a": "b"}), "the store refused it")
    assert failed.reward is None and failed.error_kind == "internal" and failed.files == {} and failed.rollout_id == "r1"
    assert failed.error == "internal error: the store refused it; its data is lost, run the rollout again"
