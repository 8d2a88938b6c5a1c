"""The eval command's texts: the progress line, the headline, the messages behind each error kind."""

import math

from harness_env.evals.report import Outcome, error_groups, headline, progress_line, summarize


def test_the_progress_line_gives_an_eta_only_once_this_run_finished_an_attempt():
    assert progress_line(5, 20, 4, 0, 30.0, resumed=5) == "5/20 done, 4 running, 0 failed, 30s, mean reward -"
    resumed_only = progress_line(5, 20, 4, 0, 30.0, resumed=5, mean_reward=0.25)
    assert resumed_only == "5/20 done, 4 running, 0 failed, 30s, mean reward 0.250"
    # 5 of this run's attempts in 100 s: the 10 left take 200 s more.
    assert progress_line(10, 20, 2, 1, 100.0, resumed=5, mean_reward=0.5) == ("10/20 done, 2 running, 1 failed, 1m40s, mean reward 0.500, ETA 3m20s")
    assert progress_line(20, 20, 0, 0, 4000.0, mean_reward=1.0).endswith("1h06m, mean reward 1.000")  # done: no ETA


def test_the_headline_gives_pass_at_1_with_its_standard_error_over_the_graded_tasks():
    outcomes = {"a": [Outcome(1.0), Outcome(1.0)], "b": [Outcome(1.0), Outcome(0.0)], "c": [Outcome(None, "sandbox")] * 2}
    se = math.sqrt(((1 - 0.75) ** 2 + (0.5 - 0.75) ** 2) / 1 / 2)
    assert headline(summarize(outcomes, 2, 1.0)) == (
        f"pass@1 0.750 ± {se:.3f} over 2 graded tasks of 3 (mean reward 0.750); infrastructure failures: 2 of 6 attempts"
    )
    nothing = summarize({"c": [Outcome(None, "endpoint")]}, 1, 1.0)
    assert headline(nothing) == "pass@1 - over 0 graded tasks of 1 (mean reward -); infrastructure failures: 1 of 1 attempts"


def test_error_groups_keep_the_most_frequent_first_lines_of_each_kind():
    pairs = [
        ("endpoint", "upstream 500\ntraceback..."),
        ("endpoint", "upstream 500\nother"),
        ("endpoint", "refused"),
        ("agent_timeout", None),
        (None, "no kind: not an error kind"),
        ("endpoint", "x" * 300),
    ]
    groups = error_groups(pairs, keep=2)
    assert groups == {"agent_timeout": [("(no message)", 1)], "endpoint": [("upstream 500", 2), ("refused", 1)]}
    assert error_groups([("endpoint", "x" * 300)])["endpoint"] == [("x" * 200, 1)]
