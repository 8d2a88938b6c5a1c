"""The turn graph and the training rows built on it."""

from harness_env.core.capture.graph import link_turns
from harness_env.models import RolloutResult, Turn
from harness_env.storage import pack, unpack


def turn(i, prompt, completion, **kw):
    kw.setdefault("upstream_status", 200)
    return Turn(index=i, prompt_token_ids=prompt, completion_token_ids=completion,
                per_token_logps=[-0.5] * len(completion), capture_level="tokens", **kw)


def test_a_conversation_that_only_appends_is_one_branch():
    turns = [turn(0, [1, 2], [3]), turn(1, [1, 2, 3, 9], [4, 5]), turn(2, [1, 2, 3, 9, 4, 5, 9], [6])]
    g = link_turns(turns)
    assert (g.branches, g.auxiliary_turns, g.failed_turns) == (1, 0, 0)
    assert [(t.parent, t.branch) for t in turns] == [(None, 0), (0, 0), (1, 0)]
    (row,) = RolloutResult(proxy_turns=turns, reward=0.5).training_rows()
    assert row.token_ids == [1, 2, 3, 9, 4, 5, 9, 6]
    assert row.loss_mask == [0, 0, 1, 0, 1, 1, 0, 1]
    assert row.logprobs == [0.0, 0.0, -0.5, 0.0, -0.5, -0.5, 0.0, -0.5]
    assert row.prompt_length == 2 and row.reward == 0.5 and row.trainable


def test_rows_carry_the_rollout_id_not_the_sandbox_id():
    """Issue 26 (2): a row joins to its rollout (the export's tables, the result) by rollout_id."""
    turns = [turn(0, [1, 2], [3]), turn(1, [1, 8], [5])]
    link_turns(turns)
    res = RolloutResult(rollout_id="r-1234", sandbox_id="rollout-abcd", task_id="t", proxy_turns=turns)
    rows = res.training_rows()
    assert len(rows) == 2 and {r.rollout_id for r in rows} == {"r-1234"}


def test_rewritten_history_starts_a_new_branch_and_a_later_turn_may_continue_an_old_one():
    turns = [
        turn(0, [1, 2], [3]),
        turn(1, [1, 2, 3, 7], [4]),
        turn(2, [1, 8], [5]),  # compacted: does not extend turn 1
        turn(3, [1, 2, 3, 7, 4, 6], [9]),  # back on the first branch
    ]
    g = link_turns(turns)
    assert g.branches == 2
    assert [(t.parent, t.branch) for t in turns] == [(None, 0), (0, 0), (None, 1), (1, 0)]
    rows = RolloutResult(proxy_turns=turns).training_rows()
    assert [r.turn_indices for r in rows] == [[0, 1, 3], [2]]


def test_auxiliary_and_failed_turns_belong_to_no_branch_and_no_row():
    turns = [
        turn(0, [1], [2]),
        turn(1, [5, 5], [6], purpose="auxiliary"),
        turn(2, [1, 2, 3], [], upstream_status=500, upstream_error="boom"),
        turn(3, [1, 2, 3], [4]),
    ]
    g = link_turns(turns)
    assert (g.branches, g.auxiliary_turns, g.failed_turns) == (1, 1, 1)
    assert turns[1].branch is None and turns[2].branch is None and turns[3].parent == 0
    (row,) = RolloutResult(proxy_turns=turns).training_rows()
    assert row.turn_indices == [0, 3]


def test_turns_without_token_ids_make_the_row_untrainable_never_zero_filled():
    turns = [Turn(index=0, completion_text="hi", upstream_status=200, capture_level="text"),
             Turn(index=1, completion_text="again", upstream_status=200, capture_level="text")]
    g = link_turns(turns)
    assert g.branches == 2  # nothing to link by
    rows = RolloutResult(proxy_turns=turns).training_rows()
    assert [r.trainable for r in rows] == [False, False]
    assert rows[0].untrainable_reason == "turn 0 has no token ids (capture level text)"
    assert rows[0].token_ids == rows[0].loss_mask == rows[0].logprobs == []


def test_missing_logprobs_make_the_row_untrainable():
    t = turn(0, [1], [2, 3])
    t.per_token_logps = [-1.0]
    link_turns([t])
    (row,) = RolloutResult(proxy_turns=[t]).training_rows()
    assert not row.trainable and "1 logprobs for 2 tokens" in row.untrainable_reason


def test_one_prefix_relation_decides_the_graph_the_rows_and_storage():
    """Turn.continues: the prompt starts with the earlier prompt + completion (the ids must end
    where the earlier ones do, and a turn without completion ids is continued by none)."""
    first = turn(0, [1, 2], [3])
    assert turn(1, [1, 2, 3], [4]).continues(first) and turn(1, [1, 2, 3, 9], [4]).continues(first)
    assert not turn(1, [1, 2], [4]).continues(first) and not turn(1, [1, 2, 4, 3], [4]).continues(first)
    assert not turn(1, [1, 2, 3], [4]).continues(turn(0, [1, 2, 3], []))
    turns = [first, turn(1, [1, 2, 3, 9], [4]), turn(2, [1, 2, 9], [5])]
    link_turns(turns)
    assert [t.parent for t in turns] == [None, 0, None]
    result = RolloutResult(proxy_turns=turns)
    packed = pack(result)["proxy_turns"]
    assert [t.get("prompt_extends_parent", False) for t in packed] == [False, True, False] and packed[1]["prompt_token_ids"] == [9]
    assert unpack(pack(result)) == result
    assert [r.trainable for r in result.training_rows()] == [True, True]
