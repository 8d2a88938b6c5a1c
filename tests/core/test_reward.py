import pytest

from harness_env.core.reward import compute_reward, parse_reward_text, tool_efficiency_reward
from harness_env.models import CommandResult


def _r(code):
    return CommandResult(cmd="x", exit_code=code)


@pytest.mark.parametrize("text,value", [("1", 1.0), (" 0.25\n", 0.25), ("-3e-1", -0.3)])
def test_finite_numbers_are_rewards(text, value):
    assert parse_reward_text(text)[0] == value


@pytest.mark.parametrize("text", ["nan", "inf", "-Infinity", "", "0.5 0.5", "yes", "1,0"])
def test_junk_is_ignored_with_a_note(text):
    value, note = parse_reward_text(text)
    assert value is None and note


def test_reward_file_wins_over_ratio():
    assert compute_reward([_r(1)], "0.75")[:2] == (0.75, "reward_file")


def test_ratio_when_no_or_bad_reward_file():
    assert compute_reward([_r(0), _r(1), _r(0), _r(None)], None)[:2] == (0.5, "verify_ratio")
    reward, source, notes = compute_reward([_r(0)], "nan")
    assert (reward, source) == (1.0, "verify_ratio") and "non-finite" in notes[0]


def test_no_verify_commands_no_reward():
    assert compute_reward([], None)[:2] == (None, None)


@pytest.mark.parametrize("correct,calls,want", [(1.0, 15, 1.05), (1.0, 1, 1.09375), (0.0, 3, 0.0), (1.0, 0, 1.0), (0.5, 15, 0.525)])
def test_tool_efficiency_reward(correct, calls, want):
    value, note = tool_efficiency_reward(correct, calls)
    assert value == pytest.approx(want) and note is None


def test_unverified_tool_count_gets_no_bonus_and_says_so():
    value, note = tool_efficiency_reward(1.0, None)
    assert value == 1.0 and "not verified" in note


@pytest.mark.parametrize("text", ["1e308", "-1e308", "1000000.5", "-2e6", "1" + "0" * 300])
def test_a_reward_outside_the_documented_range_is_ignored_with_a_note(text):
    value, note = parse_reward_text(text)
    assert value is None and "outside the reward range" in note
    reward, source, notes = compute_reward([_r(0), _r(1)], text)
    assert (reward, source) == (0.5, "verify_ratio") and "outside the reward range" in notes[0]


@pytest.mark.parametrize("text,value", [("1e6", 1e6), ("-1000000", -1e6), ("42.5", 42.5)])
def test_a_reward_at_the_range_edges_counts(text, value):
    assert parse_reward_text(text) == (value, None)
