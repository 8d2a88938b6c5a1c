import json
import math

import pytest

from harness_env.core.errors import InvalidRequestError
from harness_env.envs.harbor.reward import MAX_REWARD_FILE_BYTES, read_verifier_reward, reward_map


def _write(d, name, text):
    (d / name).write_text(text)


def test_neither_file_means_the_verifier_never_ran(tmp_path):
    reward, source, notes = read_verifier_reward(tmp_path, None)
    assert (reward, source) == (None, None)
    assert "never ran" in notes[0]


def test_reward_txt(tmp_path):
    _write(tmp_path, "reward.txt", " 0.75\n")
    assert read_verifier_reward(tmp_path, None) == (0.75, "reward_txt", [])


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "", "pass", "1\n2"])
def test_reward_txt_junk_is_ignored_with_a_note(tmp_path, text):
    _write(tmp_path, "reward.txt", text)
    reward, source, notes = read_verifier_reward(tmp_path, None)
    assert (reward, source) == (None, None)
    assert notes and "reward.txt" in notes[0]


def test_reward_json_number_wins_over_reward_txt(tmp_path):
    _write(tmp_path, "reward.json", "1")
    _write(tmp_path, "reward.txt", "0.0")
    assert read_verifier_reward(tmp_path, None) == (1.0, "reward_json", [])


def test_reward_json_single_key_map(tmp_path):
    _write(tmp_path, "reward.json", json.dumps({"score": 0.5}))
    assert read_verifier_reward(tmp_path, None) == (0.5, "reward_json", [])


def test_reward_json_map_uses_reward_key_named_reward(tmp_path):
    _write(tmp_path, "reward.json", json.dumps({"reward": 0.25, "tests_passed": 3}))
    assert read_verifier_reward(tmp_path, None)[:2] == (0.25, "reward_json")


def test_reward_json_explicit_key(tmp_path):
    _write(tmp_path, "reward.json", json.dumps({"reward": 0.25, "tests_passed": 3}))
    assert read_verifier_reward(tmp_path, "tests_passed")[:2] == (3.0, "reward_json")


def test_explicit_key_missing_is_the_callers_error_listing_keys(tmp_path):
    _write(tmp_path, "reward.json", json.dumps({"a": 1, "b": 0}))
    with pytest.raises(InvalidRequestError) as e:
        read_verifier_reward(tmp_path, "c")
    assert "'c'" in str(e.value) and "['a', 'b']" in str(e.value)


def test_ambiguous_map_without_reward_key_lists_the_keys(tmp_path):
    _write(tmp_path, "reward.json", json.dumps({"a": 1, "b": 0}))
    reward, source, notes = read_verifier_reward(tmp_path, None)
    assert (reward, source) == (None, None)
    assert "['a', 'b']" in notes[0] and "reward_key" in notes[0]


def test_ambiguous_map_falls_back_to_reward_txt(tmp_path):
    _write(tmp_path, "reward.json", json.dumps({"a": 1, "b": 0}))
    _write(tmp_path, "reward.txt", "0.5")
    reward, source, notes = read_verifier_reward(tmp_path, None)
    assert (reward, source) == (0.5, "reward_txt")
    assert len(notes) == 1


@pytest.mark.parametrize("payload", ['{"reward": NaN}', '{"reward": Infinity}', '{"reward": 1e999}', '{"reward": "1"}', '{"reward": true}'])
def test_non_finite_or_non_numeric_chosen_value_is_an_error_note(tmp_path, payload):
    _write(tmp_path, "reward.json", payload)
    reward, source, notes = read_verifier_reward(tmp_path, None)
    assert (reward, source) == (None, None)
    assert "'reward'" in notes[0] and "no reward from reward.json" in notes[0]


@pytest.mark.parametrize("payload", ["NaN", "Infinity", "true", '"0.5"', "[1]", "{}", "", "{not json"])
def test_junk_reward_json_is_ignored_with_a_note(tmp_path, payload):
    _write(tmp_path, "reward.json", payload)
    reward, source, notes = read_verifier_reward(tmp_path, None)
    assert (reward, source) == (None, None)
    assert notes and "reward.json" in notes[0]


def test_other_non_finite_keys_are_noted_but_do_not_block(tmp_path):
    _write(tmp_path, "reward.json", '{"reward": 1, "extra": NaN}')
    reward, source, notes = read_verifier_reward(tmp_path, None)
    assert (reward, source) == (1.0, "reward_json")
    assert "'extra'" in notes[0]


def test_integers_become_floats(tmp_path):
    _write(tmp_path, "reward.json", "0")
    reward, _, _ = read_verifier_reward(tmp_path, None)
    assert isinstance(reward, float) and reward == 0.0 and math.isfinite(reward)


def test_reward_map_keeps_finite_numbers_only(tmp_path):
    _write(tmp_path, "reward.json", '{"reward": 1, "acc": 0.5, "bad": NaN, "flag": true, "note": "x"}')
    assert reward_map(tmp_path) == {"reward": 1.0, "acc": 0.5}
    _write(tmp_path, "reward.json", "0.5")
    assert reward_map(tmp_path) is None  # a single number is no map
    assert reward_map(tmp_path / "missing") is None and reward_map(None) is None


def test_reward_map_is_read_within_the_size_bound(tmp_path):
    _write(tmp_path, "reward.json", '{"reward": 1, "pad": "' + "x" * MAX_REWARD_FILE_BYTES + '"}')
    assert reward_map(tmp_path) is None


def _bounded(fn, *args):
    """Run a reader in a thread with a deadline: one that opened a FIFO would never come back."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result(timeout=10)


def test_a_reward_txt_link_is_not_followed(tmp_path):
    # reward.txt as a link to a file holding a forged reward (or to a host file): never read.
    (tmp_path / "forged").write_text("1.0")
    (tmp_path / "reward.txt").symlink_to(tmp_path / "forged")
    reward, source, notes = read_verifier_reward(tmp_path, None)
    assert (reward, source) == (None, None) and "reward.txt is a symbolic link" in notes[0]


def test_reward_files_that_are_fifos_are_not_waited_on(tmp_path):
    import os

    os.mkfifo(tmp_path / "reward.json")
    os.mkfifo(tmp_path / "reward.txt")
    reward, source, notes = _bounded(read_verifier_reward, tmp_path, None)
    assert (reward, source) == (None, None)
    assert "reward.json is a FIFO" in notes[0] and "reward.txt is a FIFO" in notes[1]
    assert _bounded(reward_map, tmp_path) is None


def test_a_reward_json_link_falls_back_to_a_real_reward_txt(tmp_path):
    (tmp_path / "forged.json").write_text('{"reward": 1e308}')
    (tmp_path / "reward.json").symlink_to(tmp_path / "forged.json")
    _write(tmp_path, "reward.txt", "0.25")
    reward, source, notes = read_verifier_reward(tmp_path, None)
    assert (reward, source) == (0.25, "reward_txt") and "symbolic link" in notes[0]
    assert reward_map(tmp_path) is None


@pytest.mark.parametrize("payload", ["1e308", "-1e7", '{"reward": 1e308}', '{"reward": ' + "1" + "0" * 400 + "}", "1" + "0" * 400])
def test_a_reward_json_outside_the_reward_range_is_ignored_with_a_note(tmp_path, payload):
    _write(tmp_path, "reward.json", payload)
    _write(tmp_path, "reward.txt", "0.25")  # the next source still counts
    reward, source, notes = read_verifier_reward(tmp_path, None)
    assert (reward, source) == (0.25, "reward_txt")
    assert "outside the reward range" in notes[0]


def test_reward_txt_outside_the_reward_range_is_ignored(tmp_path):
    _write(tmp_path, "reward.txt", "1e308")
    reward, source, notes = read_verifier_reward(tmp_path, None)
    assert (reward, source) == (None, None) and "outside the reward range" in notes[0]


def test_reward_map_drops_out_of_range_numbers(tmp_path):
    _write(tmp_path, "reward.json", '{"reward": 1, "huge": 1e308, "big_int": ' + "9" * 400 + "}")
    assert reward_map(tmp_path) == {"reward": 1.0}
