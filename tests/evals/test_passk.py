"""The estimators and the summary, against hand computations."""

import math

import pytest

from harness_env.evals.passk import mean_and_stderr, pass_at_k
from harness_env.evals.report import Outcome, summarize, table


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 2, 1) == pytest.approx(0.5)  # 1 - C(2,1)/C(4,1)
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert pass_at_k(4, 2, 3) == 1.0 and pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
    assert pass_at_k(2, 1, 3) is None  # not estimable from 2 attempts
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


def test_mean_and_stderr():
    assert mean_and_stderr([]) == (None, None)
    assert mean_and_stderr([0.5]) == (0.5, None)
    mean, se = mean_and_stderr([1, 1, 0, 0])
    assert mean == 0.5 and se == pytest.approx(math.sqrt((1 / 3) / 4))


def test_infrastructure_failures_are_left_out_of_the_denominators():
    s = summarize({"a": [Outcome(1.0), Outcome(None, "endpoint"), Outcome(0.0, "agent_timeout")], "b": [Outcome(None, "sandbox")]}, 3, 1.0)
    a = s["tasks"]["a"]
    assert (a["scored"], a["passed"], a["infra_failures"], a["mean_reward"]) == (2, 1, 1, 0.5)
    assert a["pass_at_k"] == {"1": 0.5, "2": 1.0, "3": None}
    assert a["errors"] == {"agent_timeout": 1, "endpoint": 1}
    assert s["tasks"]["b"]["pass_at_k"]["1"] is None and s["tasks"]["b"]["mean_reward"] is None
    o = s["overall"]
    assert o["pass_at_k"] == {"1": 0.5, "2": 1.0, "3": None}  # b has no scored attempt: not averaged in
    assert (o["scored"], o["infra_failures"], o["attempts"]) == (2, 2, 4)
    assert (a["masked_share"], s["tasks"]["b"]["masked_share"], o["masked_share"]) == (pytest.approx(1 / 3), 1.0, 0.5)
    text = table(s)
    assert "pass@3" in text and "overall" in text and "2 of 4 attempts (50.0% masked)" in text


def test_a_cancelled_attempt_is_no_infrastructure_failure():
    s = summarize({"a": [Outcome(1.0), Outcome(None, "cancelled"), Outcome(None, "endpoint")]}, 3, 1.0)
    a = s["tasks"]["a"]
    assert (a["scored"], a["infra_failures"], a["mean_reward"]) == (1, 1, 1.0)
    assert a["errors"] == {"cancelled": 1, "endpoint": 1} and s["overall"]["infra_failures"] == 1
    assert a["masked_share"] == s["overall"]["masked_share"] == pytest.approx(2 / 3)  # neither votes nor trains


def test_masked_is_the_results_own_rule_an_unscored_attempt_with_no_failure_is_not_masked():
    s = summarize({"a": [Outcome(1.0), Outcome(None), Outcome(None, "sandbox"), Outcome(0.0, "agent_timeout")]}, 4, 1.0)
    a = s["tasks"]["a"]
    assert (a["masked"], a["masked_share"], s["overall"]["masked"]) == (1, 0.25, 1)
