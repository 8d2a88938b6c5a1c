"""Two rollouts side by side: facts, instruction, steps aligned by number, verify outputs; what
differs marked, what the agent wrote escaped."""

from __future__ import annotations

import re

from harness_env.models import CommandResult, RolloutResult, Turn
from harness_env.server.web.render_compare import compare_html, instruction, steps

SYS = {"role": "system", "content": "You are an agent."}
USER = {"role": "user", "content": "Create hello.txt containing hello."}


def _call(cid: str, command: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": "bash", "arguments": f'{{"command": "{command}"}}'}}


def _rollout(command: str, output: str, reward: float, exit_code: int) -> RolloutResult:
    call = _call("c1", command)
    answer = {"role": "assistant", "content": None, "tool_calls": [call]}
    turns = [
        Turn(index=0, request_messages=[SYS, USER], tool_calls=[call], completion_token_ids=[1, 2, 3], upstream_status=200),
        Turn(index=1, purpose="auxiliary", request_messages=[{"role": "user", "content": "title"}], completion_text="T", upstream_status=200),
        Turn(
            index=2,
            request_messages=[SYS, USER, answer, {"role": "tool", "tool_call_id": "c1", "content": output}],
            completion_text="done",
            completion_token_ids=[4],
            prompt_token_ids=[9] * 12,
            upstream_status=200,
        ),
    ]
    verify = [CommandResult(cmd="grep -qx hello hello.txt", exit_code=exit_code, stderr="" if exit_code == 0 else "no match")]
    return RolloutResult(task_id="hello", harness="whitebox", reward=reward, proxy_turns=turns, verify_results=verify, wall_s=2.0)


PASS = _rollout("echo hello > hello.txt", "", 1.0, 0)
FAIL = _rollout("echo <nope> > hello.txt", "<b>written</b>", 0.0, 1)


def test_steps_are_the_policy_calls_with_their_tool_outputs():
    got = steps(FAIL)
    assert [(s.text, s.calls, s.outputs) for s in got] == [("", ['bash({"command": "echo <nope> > hello.txt"})'], ["<b>written</b>"]), ("done", [], [])]
    assert instruction(FAIL) == "Create hello.txt containing hello."


def test_side_by_side_marks_what_differs_and_escapes():
    html = compare_html(PASS, FAIL, "A: pass", "B: fail")
    assert "<th>A: pass</th><th>B: fail</th>" in html
    facts = dict(re.findall(r'<tr data-fact="([^"]+)"><th>[^<]*</th>(<td.*?</td>)', html))
    assert facts["reward"] == '<td class="he-differs">1.0</td>' and facts["task"] == "<td>hello</td>"
    assert facts["sampled tokens"] == "<td>4</td>" and facts["model calls"] == "<td>3 (2 policy)</td>"
    assert facts["verify"] == '<td class="he-differs">1 of 1 passed</td>'
    step1 = html.split('data-step="1">')[1].split("</tr>")[0]
    assert step1.count('class="he-differs"') == 2 and "echo &lt;nope&gt; &gt; hello.txt" in step1 and "&lt;b&gt;written&lt;/b&gt;" in step1
    step2 = html.split('data-step="2">')[1].split("</tr>")[0]
    assert "he-differs" not in step2 and step2.count("done") == 2
    assert "<b>written" not in html and "<nope>" not in html
    assert "no match" in html.split('data-fact="verify output"')[1]  # each side's verify output


def test_a_longer_rollout_has_steps_the_other_lacks():
    longer = FAIL.model_copy(update={"proxy_turns": [*FAIL.proxy_turns, Turn(index=3, completion_text="more", upstream_status=200)]})
    html = compare_html(PASS, longer)
    step3 = html.split('data-step="3">')[1].split("</tr>")[0]
    assert "no such step" in step3 and "more" in step3 and 'class="he-differs"' in step3
