"""How an agent's run ended, as the result says it (core/agent_end.py): the rule for a timeout."""

from harness_env.core.agent_end import classify_agent_end
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.session import CaptureSession
from harness_env.core.harness import AgentEnd
from harness_env.models import Endpoint


def _session(held_s: float) -> CaptureSession:
    s = CaptureSession(key="k", endpoint=Endpoint(base_url="http://127.0.0.1:9/v1", model="m"), policy=CapturePolicy())
    s.sync_held_s = held_s
    return s


def test_a_timeout_is_the_agents_unless_the_trainer_held_its_calls_for_a_weight_sync():
    kind, _ = classify_agent_end(AgentEnd(timed_out=True), _session(0.0), 60)
    assert kind == "agent_timeout"  # graded: the agent's doing
    kind, message = classify_agent_end(AgentEnd(timed_out=True), _session(40.0), 60)
    assert kind == "internal" and "40 s of which its model calls waited for a weight sync" in message  # masked: never trained on
