"""The token contract against a real engine: every harness, through its real CLI and the capture
proxy, against a real vLLM (CPU, SmolLM2-135M-Instruct, float32, processed logprobs), with a
recording tap between the proxy and vLLM so each captured turn is checked against what the engine
really received and returned.

The tiny model never writes a tool call by itself: the rollout's `structured_regex` makes every
answer a tool call in the model's own (Hermes) format, so the rollout ends at its turn limit; the
logprob test has a free answer (a constrained sampler's logprobs are not the model's).
"""

from __future__ import annotations

import functools

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.core.capture.continuity import GENERATE
from tests.envs.harnesses import HARNESSES, installed
from tests.fakes.tap import Tap
from tests.vllm_engine import model_dir

# The first test also starts the engine, and Claude Code's prompts (about 20k tokens) take minutes
# to prefill on 2 cores: a bound above the rollouts' own agent_timeout_s, not pytest's default 300 s.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

# Each harness's shell tool, and the JSON its arguments take for one command (written as the
# engine's template renders arguments back: `json.dumps` spacing).
SHELL = {
    "pi": ("bash", '"command": "{cmd}"'),
    "whitebox": ("bash", '"command": "{cmd}"'),
    "opencode": ("bash", '"command": "{cmd}", "description": "list"'),
    "codex": ("exec_command", '"cmd": "{cmd}"'),
    "claude-code": ("Bash", '"command": "{cmd}"'),
    "gemini-cli": ("run_shell_command", '"command": "{cmd}"'),
}
COMMANDS = ("ls", "pwd", "echo hi")
# Every CLI with its shell tool alone. Claude Code's 21 tools' schemas are three quarters of a
# ~20k-token prompt, whose attention alone takes over ten minutes to prefill on one core, past
# Claude Code's own 600 s request timeout (it then retries); Gemini CLI's and OpenCode's other tools
# cost minutes of the suite's prefill. Denied or excluded tools leave the prompt; the dialect, the
# stream and the tool calls are the same.
HARNESS_CONFIG = {
    "claude-code": {
        "permissions": {
            "deny": [
                "Agent",
                "CronCreate",
                "CronDelete",
                "CronList",
                "Edit",
                "EnterWorktree",
                "ExitWorktree",
                "ListAgents",
                "Monitor",
                "NotebookEdit",
                "Read",
                "ReportFindings",
                "ScheduleWakeup",
                "SendMessage",
                "Skill",
                "TaskStop",
                "Workflow",
                "Write",
            ]
        }
    },
    "gemini-cli": {
        "tools": {
            "exclude": [
                "activate_skill",
                "enter_plan_mode",
                "glob",
                "grep_search",
                "invoke_agent",
                "list_background_processes",
                "list_directory",
                "read_background_output",
                "read_file",
                "replace",
                "update_topic",
                "write_file",
            ]
        }
    },
    "opencode": {"permission": {"edit": "deny"}, "tools": {t: False for t in ("edit", "glob", "grep", "read", "task", "todowrite", "write")}},
}
LOGPROB_TOLERANCE = 1e-4  # float32 engine vs float32 teacher forcing
TEACHER_FORCING_MAX_PROMPT = 6144  # longer prompts cost too long to recompute here (the harnesses' own system prompts)


def regex_literal(text: str) -> str:
    """`text` as a regex of itself (only the metacharacters escaped: the engine's regex dialect
    is not Python's, and `re.escape` escapes spaces and newlines too)."""
    return "".join("\\" + c if c in "{}[]().|*+?^$\\" else c for c in text)


def tool_call_regex(harness: str) -> str:
    """One call of the harness's shell tool, in the Hermes format the engine's parser reads, with
    one of COMMANDS."""
    name, args = SHELL[harness]
    before, after = args.split('"{cmd}"')
    head = '<tool_call>\n{"name": "' + name + '", "arguments": {' + before + '"'
    tail = '"' + after + "}}\n</tool_call>"
    return regex_literal(head) + "(" + "|".join(regex_literal(c) for c in COMMANDS) + ")" + regex_literal(tail)


@pytest.fixture(params=HARNESSES)
def harness(request):
    return installed(request.param)


def tokenize(vllm_server, body: dict) -> list[int]:
    req = {"model": vllm_server.model, "messages": body["messages"], "add_generation_prompt": True}
    if body.get("tools"):
        req["tools"] = body["tools"]
    if body.get("chat_template_kwargs"):
        req["chat_template_kwargs"] = body["chat_template_kwargs"]
    return vllm_server.post("/tokenize", req)["tokens"]


async def test_every_captured_turn_is_what_the_real_engine_saw_and_sampled(vllm_server, tap, harness):
    req = RolloutRequest(
        task=Task(instruction="List the files in this directory, then say what you found.", task_id="contract", verify=["true"]),
        endpoint=Endpoint(base_url=tap.base_url, api_key="", model=vllm_server.model),
        # 96: room for a constrained call spelled in many small tokens to end (at 64 some were cut,
        # and a call cut at max_tokens is continued by its messages, not its tokens).
        harness=harness,
        top_logprobs=2,
        temperature=1.0,
        max_turns=3,
        max_tokens_cap=96,
        structured_regex=tool_call_regex(harness),
        agent_timeout_s=900,
        harness_config=HARNESS_CONFIG.get(harness, {}),
    )
    res = await run_rollout(req)
    check_contract(vllm_server, tap, res, harness)


def check_contract(vllm_server, tap: Tap, res, label: str) -> None:
    """The contract of one rollout whose every answer was a tool call (`tool_call_regex`): each
    captured turn against the exchange the tap recorded, the arguments echoed byte-exact, the text
    continuous; prints the calls and branches."""
    # Every answer is a tool call: the rollout ends at the turn limit, and is graded.
    assert res.turn_limit_hit and res.reward == 1.0, (res.error, res.error_kind, res.agent_log_tail)
    assert res.capture_level == "tokens" and res.rollout_type == "train", res
    turns = [t for t in res.proxy_turns if t.purpose == "policy"]
    # A call that continued its thread went to vLLM as token ids (generate), the others as chat.
    calls = [x for x in tap.exchanges if x in tap.chat_calls() or x.path.endswith(GENERATE)]
    assert len(turns) == len(calls) >= 2, (len(turns), len(calls))
    for turn, call in zip(turns, calls):
        if call.path.endswith(GENERATE):  # the ids sent and the ids and logprobs vLLM returned, whole or streamed
            choice = call.answer_choice()
            assert turn.prompt_token_ids == call.body["token_ids"], f"turn {turn.index}: prompt ids"
            assert turn.completion_token_ids == choice["token_ids"] and turn.completion_token_ids
            assert turn.per_token_logps == choice["logprobs"]
            continue
        sent, answer = call.body, call.answer_choice()
        assert turn.stream == call.streamed
        # The prompt: vLLM's own tokenisation of the request it received.
        assert turn.prompt_token_ids == tokenize(vllm_server, sent), f"turn {turn.index}: prompt ids"
        # The completion: the ids and logprobs vLLM returned, whole or streamed.
        assert turn.completion_token_ids == answer["token_ids"] and turn.completion_token_ids
        assert turn.per_token_logps == answer["logprobs"]
    # What the harness sent back reaches the engine byte-exact: each tool call's arguments as
    # vLLM wrote them, in the next request's history.
    for before, after in zip(calls, calls[1:]):
        written = before.answer_choice()["tool_calls"] if GENERATE not in before.path + after.path else None
        if not written:
            continue
        echoed = [
            (c["function"]["name"], c["function"]["arguments"])
            for m in after.body["messages"]
            if m.get("role") == "assistant"
            for c in m.get("tool_calls") or []
        ]
        for call in written:
            assert call in echoed, f"{call} came back as {echoed}"
    # Each prompt extends the text sampled before it; where only the tokens differ (the engine's
    # template re-tokenises text the sampler spelled otherwise) the turn starts a branch.
    text_splits, token_splits = continuity(vllm_server, turns)
    assert text_splits == [], f"{label}: what went back to the engine is not what it sampled: {text_splits}"
    assert res.graph.branches == 1 + len(token_splits), (res.graph, token_splits)
    if res.continuity == "tokens":  # the proxy sent the ids it had: no re-tokenisation splits a thread
        assert token_splits == [] and res.graph.branches == 1, token_splits
    # Every token the policy sampled reaches a trainable row, once; an auxiliary call's never does.
    rows = [r for r in res.training_rows() if r.trainable]
    sampled = sum(len(t.completion_token_ids) for t in turns)
    assert sum(sum(r.loss_mask) for r in rows) == res.graph.trainable_tokens == res.graph.sampled_tokens == sampled > 0
    assert sorted(i for r in rows for i in r.turn_indices) == [t.index for t in turns]
    auxiliary = sum(len(t.completion_token_ids) for t in res.proxy_turns if t.purpose == "auxiliary")
    print(
        f"\n{label}: {len(turns)} policy calls, {res.graph.branches} branches ({len(token_splits)} re-tokenised: {token_splits}); "
        f"{res.graph.trainable_tokens} of {sampled} sampled policy tokens in rows ({res.graph.trained_share:.0%}), "
        f"0 of {auxiliary} auxiliary"
    )


def continuity(vllm_server, turns) -> tuple[list[str], list[str]]:
    """Where a turn's prompt stops extending the turn before it (prompt + completion): in the text
    (decoded), or in the tokens only."""

    def text(ids: list[int]) -> str:
        return vllm_server.post("/detokenize", {"model": vllm_server.model, "tokens": ids})["prompt"]

    text_splits, token_splits = [], []
    for before, after in zip(turns, turns[1:]):
        sampled = before.prompt_token_ids + before.completion_token_ids
        if after.prompt_token_ids[: len(sampled)] == sampled:
            continue
        n = next((i for i, (a, b) in enumerate(zip(sampled, after.prompt_token_ids)) if a != b), min(len(sampled), len(after.prompt_token_ids)))
        where = f"turn {after.index} at token {n}: sampled {text(sampled[n : n + 8])!r}, sent {text(after.prompt_token_ids[n : n + 8])!r}"
        was, now = text(sampled), text(after.prompt_token_ids)
        (token_splits if now.startswith(was) else text_splits).append(where)
    return text_splits, token_splits


@functools.cache
def _teacher():
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir()), dtype=torch.float32).eval()


def teacher_forced(prompt_ids: list[int], completion_ids: list[int], temperature: float, chunk: int = 2048) -> list[float]:
    """log_softmax(logits / T) of each completion token, on the weights vLLM serves (float32),
    the sequence fed in chunks through the KV cache (a harness's 20k-token prompt in one piece
    would need gigabytes of attention scores)."""
    import torch
    from transformers import DynamicCache

    model = _teacher()
    ids = prompt_ids + completion_ids
    cache, logits = DynamicCache(), []
    with torch.no_grad():
        for start in range(0, len(ids), chunk):
            piece = torch.tensor([ids[start : start + chunk]])
            out = model(piece, cache=cache, use_cache=True)
            logits.append(out.logits[0])
    scores = torch.cat(logits)[len(prompt_ids) - 1 : -1].float() / temperature
    logps = torch.log_softmax(scores, dim=-1)
    return [logps[i, t].item() for i, t in enumerate(completion_ids)]


async def test_captured_logprobs_equal_teacher_forced_ones(vllm_server, tap):
    """Free text (no constraint: the constrained sampler's logprobs are not the model's), recomputed
    by teacher forcing on the same float32 weights."""
    req = RolloutRequest(
        task=Task(instruction="Say hello in one short sentence.", task_id="tf", verify=["true"]),
        endpoint=Endpoint(base_url=tap.base_url, api_key="", model=vllm_server.model),
        harness="whitebox",
        top_logprobs=2,
        temperature=0.7,
        max_turns=1,
        max_tokens_cap=32,
    )
    res = await run_rollout(req)
    assert res.error is None, res.error
    turn = next(t for t in res.proxy_turns if t.purpose == "policy")
    assert len(turn.prompt_token_ids) <= TEACHER_FORCING_MAX_PROMPT
    forced = teacher_forced(turn.prompt_token_ids, turn.completion_token_ids, 0.7)
    gap = max(abs(a - b) for a, b in zip(turn.per_token_logps, forced))
    assert len(forced) == len(turn.per_token_logps) and gap < LOGPROB_TOLERANCE, gap
