"""A stored rollout's request on its page: task, harness, endpoint without its key, the options
that differ from their defaults; escaped."""

from __future__ import annotations

from harness_env.models import Endpoint, RolloutRequest, Task
from harness_env.server.web.render_request import changed_options, request_html


def test_the_request_without_its_key_and_only_the_options_set():
    task = Task(instruction="<b>Create</b> a.txt", verify=["test -f a.txt"], files={"b.txt": "x"}, task_id="t-7")
    stored = RolloutRequest(
        task=task, endpoint=Endpoint(base_url="http://127.0.0.1:9/v1", model="m", api_key="sk-stored"), harness="pi", max_turns=5
    ).model_dump(mode="json")
    assert changed_options(stored) == {"max_turns": 5}
    html = request_html(stored)
    assert "sk-stored" not in html and "**********" not in html
    assert "request: task t-7 · pi · model m" in html and "http://127.0.0.1:9/v1 · model m (its key is never stored)" in html
    assert "&lt;b&gt;Create&lt;/b&gt;" in html and "<b>" not in html
    assert "&quot;max_turns&quot;: 5" in html and "b.txt" in html
    assert request_html(None) == ""
