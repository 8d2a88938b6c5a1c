"""run_rollout's answers are sized for an agent: a summary of at most 16 KB by default, whatever
the rollout (a 40-turn one run for real, an adversarial one built by hand), the whole result only
with detail="full", and the data once per answer, for the MCP SDK's client and OpenEnv's."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver.exceptions import ToolError
from websockets.sync.client import connect as ws_connect

from harness_env.models import MAX_SUMMARY_BYTES, CommandResult, Phase, RolloutArgs, RolloutResult, RolloutSummary, Turn, summarize
from harness_env.models import summary as models_summary
from harness_env.models.summary import FINAL_TEXT_BYTES, MAX_FILES_SHOWN, MAX_NOTES, MAX_PHASES, clip, json_size
from harness_env.server.mcp.rollout import rollout_args, run_rollout_output_schema
from harness_env.server.mcp.tools import McpToolServer
from tests import openenv_env
from tests.fakes.policy import FakePolicy, FakePolicyServer
from tests.server_process import ServerProcess

TURNS = 40
# 39 shell calls, each printing 200 lines the next prompt carries, then a final answer.
SCRIPT = [{"bash": f"seq 1 200; echo step {i} >> steps.txt"} for i in range(TURNS - 1)] + [{"text": "FINAL-ANSWER: steps.txt holds 39 lines."}]


def _sizes(data: dict) -> list[int]:
    """Bytes of `data` as JSON, every way it may be written (raw UTF-8, escaped ASCII)."""
    return [
        len(json.dumps(data, ensure_ascii=True)),
        len(json.dumps(data, ensure_ascii=False).encode()),
        len(RolloutSummary.model_validate(data).model_dump_json().encode()),
    ]


# -- the summary, built by hand --------------------------------------------------------------------
WIDE = ["a", "é", "\x00", "🫀", "\u2028"]  # 1, 2 (6 escaped), 6, 4 (12 escaped), 3 (6 escaped) bytes


@pytest.mark.parametrize("char", WIDE)
def test_clip_keeps_what_fits_and_says_how_much_was_cut(char):
    assert clip(char * 8, 100) == char * 8  # 96 bytes at the widest
    cut = clip(char * 100_000, 300)
    assert json_size(cut) <= 300 and len(json.dumps(cut, ensure_ascii=False).encode()) - 2 <= 300
    head, mark = cut.split(" [... ", 1)
    assert set(head) == {char} and mark == f"{100_000 - len(head)} more characters]"
    assert json_size(clip(char * 100_000, 300) + char) > 300 or len(head) == 100_000  # nothing more would fit


def _adversarial() -> RolloutResult:
    """A result larger than anything should make it in every field the summary reads: megabyte
    texts of the widest characters, thousands of notes, phases and files (tens of MB in all)."""
    huge = "🫀\x00é" * 300_000  # 900,000 characters, up to 7.2 MB escaped
    long = "🫀\x00é" * 300
    turns = [
        Turn(
            index=i,
            completion_text=long,
            prompt_token_ids=list(range(5000)),
            completion_token_ids=[1] * 500,
            tool_calls=[{"function": {"name": "bash"}}] * 5,
            usage={"prompt_tokens": 10**400},
        )
        for i in range(TURNS)
    ]
    return RolloutResult(
        rollout_id=huge,
        task_id=huge,
        harness=huge,
        reward=0.5,
        error=huge,
        error_kind="agent_error",
        agent_final_text=huge,
        reward_notes=[huge] + [long] * 5000,
        rollout_type_reason=huge,
        proxy_turns=turns,
        phases=[Phase(name=huge, started=0.0, duration_s=1.5, detail=huge)] + [Phase(name=long, started=0.0, duration_s=1.0, detail=long)] * 2000,
        files={"-" + "ü" * 100_000: huge, **{f"{i:05d}/" + "ü" * 300: long for i in range(3000)}},
        setup_results=[CommandResult(cmd=huge, exit_code=0, stdout=huge)],
        agent_log_tail=huge,
        proxy_log_tail=huge,
        sandbox_notes=[long] * 100,
        limits_hit=[long] * 100,
        grading={"png": huge},
        agent_trajectory={"steps": [long] * 100},
    )


def test_an_adversarial_result_still_summarizes_in_16_kb(monkeypatch):
    result = _adversarial()
    measured: list[int] = []

    def spy(text: str) -> int:
        measured.append(len(text))
        return json_size(text)

    with monkeypatch.context() as m:
        m.setattr(models_summary, "json_size", spy)
        summary = summarize(result)
    # Clipping measures the head of a text (at most the widest budget and its mark), never all of it.
    assert measured and max(measured) <= FINAL_TEXT_BYTES + 50, max(measured)
    data = summary.model_dump(mode="json")
    assert max(_sizes(data)) <= MAX_SUMMARY_BYTES, _sizes(data)
    assert summary.reward == 0.5 and summary.error_kind == "agent_error" and summary.model_calls == 40
    assert summary.completion_tokens == 40 * 500 and summary.prompt_tokens == 40 * 5000 and summary.tool_calls == 200
    assert len(summary.files) == MAX_FILES_SHOWN and summary.files_left_off == 3001 - MAX_FILES_SHOWN
    assert summary.files[0].path.endswith("more characters]") and summary.files[0].bytes == len(result.error.encode())
    assert summary.files[1].path.startswith("00000/ü") and summary.files[1].bytes == len(result.files["00000/" + "ü" * 300].encode())
    assert len(summary.reward_notes) == MAX_NOTES and summary.reward_notes_left_off == 5001 - MAX_NOTES
    assert len(summary.phases) == MAX_PHASES and summary.phases_left_off == 2001 - MAX_PHASES
    assert summary.error.endswith("more characters]") and summary.agent_final_text.startswith("🫀\x00é")
    assert len(summary.agent_final_text) <= FINAL_TEXT_BYTES
    assert RolloutSummary.model_validate_json(summary.model_dump_json()) == summary  # a client parses it, bounds and all
    assert len(summary.text()) < 1500 and summary.text().count("\n") <= 3


def test_the_final_text_falls_back_on_the_last_policy_turn_and_counts_fall_back_on_usage():
    turns = [
        Turn(index=0, completion_text="first", usage={"prompt_tokens": 7, "completion_tokens": 3}, tool_calls=[{}, {}]),
        Turn(index=1, completion_text="last words", usage={"prompt_tokens": 9, "completion_tokens": 2}),
        Turn(index=2, purpose="auxiliary", completion_text="a title"),
    ]
    summary = summarize(RolloutResult(proxy_turns=turns, files={"b.txt": "hé", "a.txt": "x" * 10 + "\n[... truncated ...]"}))
    assert summary.agent_final_text == "last words"
    assert (summary.model_calls, summary.prompt_tokens, summary.completion_tokens, summary.tool_calls) == (3, 16, 5, 2)
    assert [(f.path, f.bytes, f.truncated) for f in summary.files] == [("a.txt", 30, True), ("b.txt", 3, False)]
    assert summary.error is None and summary.reward is None and "no reward" in summary.text()


def test_detail_is_declared_once_checked_and_summary_by_default():
    assert "detail" not in RolloutArgs.model_fields  # the tool's argument, not a rollout option (CLI, HTTP, web form)
    assert rollout_args({"instruction": "x"}).detail == "summary"
    assert rollout_args({"instruction": "x", "detail": "full"}).detail == "full"
    with pytest.raises(ToolError) as e:
        rollout_args({"instruction": "x", "detail": "everything"})
    assert str(e.value).count("\n") == 0 and "detail" in str(e.value) and "'summary' or 'full'" in str(e.value)
    tools = McpToolServer(service=None)
    listed = {t.name: t for t in asyncio.run(tools.mcp.list_tools())}["run_rollout"]
    prop = listed.input_schema["properties"]["detail"]
    assert prop["default"] == "summary" and prop["enum"] == ["summary", "full"] and "16 KB" in prop["description"]
    assert listed.output_schema == json.loads(json.dumps(run_rollout_output_schema())) and listed.output_schema["type"] == "object"


def test_the_output_schema_holds_both_answers_and_tells_them_apart():
    schema = run_rollout_output_schema()
    result = RolloutResult(
        reward=1.0,
        error="x",
        proxy_turns=[Turn(index=0, prompt_token_ids=[1, 2], completion_token_ids=[3])],
        files={"a.txt": "a"},
        phases=[Phase(name="agent", started=0.0, duration_s=1.0)],
        reward_notes=["n"],
    )
    full, summary = result.model_dump(mode="json"), summarize(result).model_dump(mode="json")
    jsonschema.validate(summary, schema)
    jsonschema.validate(full, schema)
    summary_only = {**schema, "anyOf": [schema["anyOf"][0]]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(full, summary_only)


# -- for real: a served process, a 40-turn rollout, the SDK's client and OpenEnv's --------------------
SERVED = pytest.mark.slow  # through a server in a process of its own: not in the fast tier


@pytest.fixture(scope="module")
def policy():
    with FakePolicyServer(FakePolicy()) as srv:
        srv.policy.scripts["m"] = SCRIPT
        yield srv


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("mcp-summary-sandboxes"))
    yield s
    s.stop()


def _args(policy, **kw) -> dict:
    return {
        "instruction": "Append 39 lines to steps.txt, one per step.",
        "harness": "whitebox",
        "base_url": policy.base_url,
        "model": "m",
        "verify": ["test $(wc -l < steps.txt) -eq 39"],
        "agent_timeout_s": 120,
        **kw,
    }


@pytest.fixture(scope="module")
def mcp_answers(server, policy) -> dict[str, object]:
    """The same 40-turn rollout asked through the MCP SDK's client: by default, and in full."""

    async def call() -> dict[str, object]:
        # The SDK's client reads SSE events of up to 1 MiB unless told otherwise; a whole 40-turn result is more.
        async with streamable_http_client(server.url + "/mcp", max_sse_event_size=None) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return {
                    "summary": await session.call_tool("run_rollout", _args(policy)),
                    "full": await session.call_tool("run_rollout", _args(policy, detail="full")),
                }

    return asyncio.run(call())


@SERVED
def test_a_40_turn_rollout_summary_is_at_most_16_kb_over_mcp(mcp_answers):
    out = mcp_answers["summary"]
    assert not out.is_error, out.content
    summary = out.structured_content
    assert summary["detail"] == "summary" and summary["error"] is None and summary["reward"] == 1.0
    assert summary["model_calls"] == TURNS and summary["tool_calls"] == TURNS - 1 and summary["harness"] == "whitebox"
    assert summary["prompt_tokens"] > 0 and summary["completion_tokens"] > 0 and summary["rollout_type"] == "train"
    assert summary["agent_final_text"] == "FINAL-ANSWER: steps.txt holds 39 lines." and len(summary["rollout_id"]) == 12
    assert [f["path"] for f in summary["files"]] == ["steps.txt"] and summary["files"][0]["bytes"] == len("".join(f"step {i}\n" for i in range(39)))
    assert [p["name"] for p in summary["phases"]][:4] == ["queue", "endpoint", "start_wait", "sandbox"]
    assert max(_sizes(summary)) <= MAX_SUMMARY_BYTES
    assert len(out.model_dump_json(by_alias=True)) <= MAX_SUMMARY_BYTES + 2000  # the whole answer, text and all
    text = out.content[0].text
    assert [c.type for c in out.content] == ["text"] and len(text) < 1000 and text.startswith("reward 1 (verify_ratio)")
    assert f"{TURNS} model calls" in text and "FINAL-ANSWER" in text and not text.lstrip().startswith("{")


@SERVED
def test_detail_full_gives_the_whole_result_once(mcp_answers):
    out = mcp_answers["full"]
    assert not out.is_error, out.content
    result = RolloutResult.model_validate(out.structured_content)
    assert "detail" not in out.structured_content and len(result.proxy_turns) == TURNS and result.reward == 1.0
    assert all(t.completion_token_ids and t.prompt_token_ids for t in result.proxy_turns)
    answer = out.model_dump_json(by_alias=True)
    assert answer.count("prompt_token_ids") == TURNS  # the turns once: not in the text a second time
    assert len(out.content) == 1 and len(out.content[0].text) < 1000 and out.content[0].text.startswith("reward 1")
    assert len(answer) > 20 * MAX_SUMMARY_BYTES  # what the summary spares an agent


@SERVED
def test_a_bad_detail_is_one_clear_tool_error(server, policy):
    async def call():
        async with streamable_http_client(server.url + "/mcp") as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await session.call_tool("run_rollout", _args(policy, detail="everything"))

    out = asyncio.run(call())
    assert out.is_error and "detail" in out.content[0].text and "summary" in out.content[0].text, out.content
    assert len(out.content[0].text) < 300


@SERVED
def test_openenv_client_gets_the_summary_by_default_and_the_whole_result_when_asked(server, policy):
    steps = [
        {"call": "run_rollout", "arguments": _args(policy)},
        {"call": "run_rollout", "arguments": _args(policy, detail="full")},
        {"call": "run_rollout", "arguments": _args(policy, detail="everything")},
    ]
    summary, full, bad = openenv_env.check("mcp_client", {"base_url": server.url, "style": "async_with", "steps": steps})["results"]
    summary, full = summary["data"], full["data"]
    assert summary["detail"] == "summary" and summary["reward"] == 1.0 and summary["model_calls"] == TURNS
    assert max(_sizes(summary)) <= MAX_SUMMARY_BYTES
    assert full["reward"] == 1.0 and len(full["proxy_turns"]) == TURNS
    assert bad["error"]["type"] == "RuntimeError" and "detail" in bad["error"]["message"]


@SERVED
def test_openenv_json_rpc_answer_carries_the_data_once(server, policy):
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_rollout", "arguments": _args(policy, detail="full")}}
    r = httpx.post(server.url + "/mcp", json=rpc, headers={"accept": "*/*"}, timeout=300)
    body = r.json()["result"]
    assert set(body) == {"content", "isError", "data"} and len(body["data"]["proxy_turns"]) == TURNS
    assert r.text.count("prompt_token_ids") == TURNS and len(body["content"][0]["text"]) < 1000
    rpc["params"]["arguments"] = _args(policy)
    r = httpx.post(server.url + "/mcp", json=rpc, headers={"accept": "*/*"}, timeout=300)
    assert r.json()["result"]["data"]["detail"] == "summary" and len(r.content) <= MAX_SUMMARY_BYTES + 2000
    # The session socket older OpenEnv clients send their calls over: the same data.
    with ws_connect(server.url.replace("http://", "ws://") + "/ws") as ws:
        ws.send(json.dumps({"type": "step", "data": {"type": "call_tool", "tool_name": "run_rollout", "arguments": _args(policy)}}))
        obs = json.loads(ws.recv(timeout=300))["data"]["observation"]
    assert obs["error"] is None and obs["result"]["data"]["detail"] == "summary" and obs["result"]["data"]["model_calls"] == TURNS
    server.assert_no_rollout_left()
