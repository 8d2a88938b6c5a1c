"""The turn graph and the training rows built on it."""

import json

from harness_env.core.capture.graph import link_turns, summarise_rows
from harness_env.models import RolloutResult, Turn
from harness_env.storage import pack, unpack


def turn(i, prompt, completion, **kw):
    kw.setdefault("upstream_status", 200)
    kw.setdefault("capture_level", "tokens")
    return Turn(index=i, prompt_token_ids=prompt, completion_token_ids=completion, per_token_logps=[-0.5] * len(completion), **kw)


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


def test_the_trained_share_counts_the_policy_s_samples_that_reach_a_trainable_row():
    """graph.sampled_tokens: the policy's answered turns only; a branch with a turn that lost its
    logprobs keeps its samples out of trainable_tokens, so the share says what a trainer lost."""
    lost = turn(3, [1, 9], [7, 7])
    lost.per_token_logps = []
    turns = [
        turn(0, [1], [2, 3]),
        turn(1, [5], [6, 6, 6], purpose="auxiliary"),
        turn(2, [1, 2, 3, 4], [5]),
        lost,
        turn(4, [1, 2, 3], [], upstream_status=500, upstream_error="boom"),
    ]
    res = RolloutResult(proxy_turns=turns)
    g = summarise_rows(link_turns(turns), res.training_rows())
    assert (g.sampled_tokens, g.trainable_tokens, g.auxiliary_tokens) == (5, 3, 3)
    assert g.trained_share == 3 / 5
    assert link_turns([]).trained_share is None


def test_turns_without_token_ids_make_the_row_untrainable_never_zero_filled():
    turns = [
        Turn(index=0, completion_text="hi", upstream_status=200, capture_level="text"),
        Turn(index=1, completion_text="again", upstream_status=200, capture_level="text"),
    ]
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


# -- the link kinds (docs/training.md shows each) ----------------------------------------------
SYSTEM = {"role": "system", "content": "You are a coding agent."}
ASK = {"role": "user", "content": "fix the failing test in tests/test_app.py"}
CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "pytest -q"}'}}


def said(i, prompt, completion, messages, **kw):
    return turn(i, prompt, completion, request_messages=messages, **kw)


def first_call(**kw):
    return said(0, [1, 2], [3, 4], [SYSTEM, ASK], tool_calls=[CALL], **kw)


def answer_of(t, **extra):
    return {"role": "assistant", "content": t.completion_text or None, "tool_calls": t.tool_calls, **extra}


def kinds(turns):
    graph = link_turns(turns)
    return [(t.link, t.parent, t.branch) for t in turns], graph


def test_a_call_whose_tokens_continue_extends_its_branch():
    first = first_call()
    # The harness wrote the arguments back spaced otherwise: the messages are equal as JSON.
    again = dict(CALL, function={"name": "bash", "arguments": '{"command":"pytest -q"}'})
    second = said(1, [1, 2, 3, 4, 9], [5], [SYSTEM, ASK, {"role": "assistant", "tool_calls": [again]}, {"role": "tool", "content": "1 failed"}])
    links, graph = kinds([first, second])
    assert links == [("new_thread", None, 0), ("extends", 0, 0)]
    assert graph.links == {"new_thread": 1, "extends": 1} and graph.branches == 1


def test_messages_that_continue_with_other_tokens_are_a_template_rerender():
    first = first_call()
    second = said(1, [1, 2, 77, 9], [5], [SYSTEM, ASK, answer_of(first), {"role": "tool", "content": "1 failed"}])
    links, graph = kinds([first, second])
    assert links == [("new_thread", None, 0), ("template_rerender", 0, 1)] and graph.branches == 2


def test_messages_that_continue_without_the_sampled_reasoning_are_reasoning_dropped():
    first = first_call(reasoning_text="the test imports a name that moved")
    with_reasoning = answer_of(first, reasoning_content="the test imports a name that moved")
    kept = said(1, [1, 2, 3, 4, 9], [5], [SYSTEM, ASK, with_reasoning, {"role": "tool", "content": "x"}])
    dropped = said(2, [1, 2, 88, 9], [5], [SYSTEM, ASK, answer_of(first), {"role": "tool", "content": "1 failed"}])
    links, _ = kinds([first, kept, dropped])
    assert links[1] == ("extends", 0, 0) and links[2] == ("reasoning_dropped", 0, 1)
    # ... and earlier answers' reasoning gone from the history too (a later call of the same thread)
    history = [SYSTEM, ASK, answer_of(first, reasoning_content="r"), {"role": "tool", "content": "x"}]
    third = said(3, [1, 2, 3, 4, 9, 5, 6], [7], history, completion_text="done")
    fourth = said(4, [1, 2, 40], [8], [*history[:2], answer_of(first), history[3], answer_of(third)])
    assert kinds([third, fourth])[0][1] == ("reasoning_dropped", 3, 1)


def test_a_thread_started_with_the_text_a_tool_call_handed_over_is_a_subagent():
    task = "Find every caller of parse_config and list their files"
    first = said(
        0,
        [1, 2],
        [3],
        [SYSTEM, ASK],
        tool_calls=[{"id": "t", "type": "function", "function": {"name": "Task", "arguments": json.dumps({"description": "find callers", "prompt": task})}}],
    )
    sub = said(1, [50, 51], [52], [{"role": "system", "content": "You are a search agent."}, {"role": "user", "content": task}])
    links, graph = kinds([first, sub])
    assert links[1] == ("subagent", 0, 1) and graph.links["subagent"] == 1


def test_the_same_system_prompt_with_a_shorter_history_is_a_compaction():
    first = first_call()
    second = said(1, [1, 2, 3, 4, 9], [5], [SYSTEM, ASK, answer_of(first), {"role": "tool", "content": "1 failed"}], tool_calls=[CALL])
    summary = {"role": "user", "content": "Summary of the work so far: the test fails on an import."}
    compacted = said(2, [1, 2, 60], [61], [SYSTEM, summary])
    links, graph = kinds([first, second, compacted])
    assert links[2] == ("compaction", 1, 1) and graph.branches == 2
    other = said(3, [70], [71], [{"role": "system", "content": "another agent"}, summary])
    assert kinds([first, other])[0][1] == ("new_thread", None, 1)
    # Compacted right after the first call (Codex): the task and a summary instead of the task, the
    # call and its result, so one message more than the first call sent, fewer than its thread had.
    early = said(2, [1, 2, 80], [81], [SYSTEM, ASK, summary])
    assert kinds([first_call(), early])[0][1] == ("compaction", 0, 1)
    assert kinds([first_call(), said(2, [1, 2, 80], [81], [SYSTEM, ASK, summary, summary])])[0][1] == ("new_thread", None, 1)


def test_auxiliary_retry_and_failed_turns_are_counted_apart():
    first = first_call()
    title = turn(1, [9], [9], purpose="auxiliary")
    retry = Turn(index=2, upstream_status=200, parent=0, link="retry", capture_level="tokens")
    failed = turn(3, [1], [], upstream_status=502, upstream_error="unreachable")
    links, graph = kinds([first, title, retry, failed])
    assert links == [("new_thread", None, 0), ("auxiliary", None, None), ("retry", 0, None), (None, None, None)]
    assert graph.links == {"new_thread": 1, "auxiliary": 1, "retry": 1} and graph.failed_turns == 1
    assert [r.turn_indices for r in RolloutResult(proxy_turns=[first, title, retry, failed]).training_rows()] == [[0]]


def test_calls_without_token_ids_are_linked_by_their_messages():
    first = said(0, [], [], [SYSTEM, ASK], completion_text="Looking.", capture_level="text")
    second = said(1, [], [], [SYSTEM, ASK, answer_of(first), {"role": "user", "content": "go on"}], completion_text="ok", capture_level="text")
    links, graph = kinds([first, second])
    assert links == [("new_thread", None, 0), ("extends", 0, 0)] and graph.branches == 1
