"""evaluate()'s recording: a store that fails costs a warning, never the evaluation."""

import json
import logging

from harness_env.evals.run import attempt_path, evaluate, write_atomic
from harness_env.models import RolloutRequest, RolloutResult
from harness_env.storage import pack


class BrokenStore:
    """A recorder whose every call fails, as a full disk or a lost database would."""

    def __init__(self):
        self.calls: list[str] = []

    def __getattr__(self, name):
        def fail(*args, **kw):
            self.calls.append(name)
            raise OSError("disk full")

        return fail


def test_a_recorder_that_fails_is_logged_and_the_evaluation_goes_on(tmp_path, caplog):
    request = RolloutRequest.model_validate(
        {
            "task": {"instruction": "x", "task_id": "t", "verify": ["true"]},
            "harness": "whitebox",
            "endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "m"},
        }
    )
    for i in range(2):  # both attempts finished already: nothing runs, the summary is made from the files
        write_atomic(attempt_path(tmp_path, "t", i), json.dumps(pack(RolloutResult(task_id="t", reward=1.0))))
    with caplog.at_level(logging.WARNING, logger="harness_env.evals"):
        recorder = BrokenStore()
        summary = evaluate([("t", request)], tmp_path, attempts=2, recorder=recorder)
    assert summary["overall"]["mean_reward"] == 1.0 and json.loads((tmp_path / "summary.json").read_text())["overall"]["scored"] == 2
    assert recorder.calls == ["begin", "end"]
    assert [r.getMessage() for r in caplog.records].count(
        "could not record the eval run in the store (OSError: disk full); its results are in the output directory"
    ) == 2
