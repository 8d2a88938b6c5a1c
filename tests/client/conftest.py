"""Fixtures of the TRL adapter's tests: a white-box request against the scripted policy, and a
white-box loop that compacts its history once per rollout."""

import itertools

import pytest


@pytest.fixture
def request_for(policy_server):
    policy_server.policy.scripts["m"] = [{"bash": "touch a"}, {"text": "done"}]
    return {"harness": "whitebox", "endpoint": {"base_url": policy_server.base_url, "model": "m"}, "temperature": 1.0, "agent_timeout_s": 30}


@pytest.fixture
def compacting(monkeypatch):
    """The white-box loop made to compact once: before its second model call its history is
    replaced by a summary, as a harness compacting its context does. The turns after it form a
    second branch of the turn graph."""
    from harness_env.envs.whitebox import loop

    real, calls = loop.request_body, itertools.count()

    def request_body(model, messages, max_tokens):
        if next(calls) % 3 == 1:  # each rollout makes three calls: compact before its second
            messages[:] = [messages[0], {"role": "user", "content": "Summary of the work so far: a is made. Make a again, then stop."}]
        return real(model, messages, max_tokens)

    monkeypatch.setattr(loop, "request_body", request_body)
