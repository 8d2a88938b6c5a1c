"""The one request pipeline (core/pipeline.py): what it refuses before any work starts."""

import pytest

from harness_env import Endpoint, RolloutRequest, Task, envs  # noqa: F401 - registers the harnesses
from harness_env.core.errors import InvalidRequestError
from harness_env.core.pipeline import prepare


def _request(harness: str) -> RolloutRequest:
    return RolloutRequest(
        task=Task(instruction="x", verify=["true"], image="127.0.0.1:5000/org/name:1"),
        harness=harness,
        endpoint=Endpoint(base_url="http://127.0.0.1:9/v1", model="m"),
    )


def test_a_task_image_for_a_harness_that_brings_its_own_environment_is_refused_not_ignored():
    with pytest.raises(InvalidRequestError, match="harness 'harbor' runs the task in an environment of its own"):
        prepare(_request("harbor"), trusted=True)
    assert prepare(_request("whitebox"), trusted=True).request.task.image == "127.0.0.1:5000/org/name:1"  # the local sandbox's
