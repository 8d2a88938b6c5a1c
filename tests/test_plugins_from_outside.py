"""Plug-ins added from outside the package, through the registries alone, run rollouts: a harness
(an agent loop written here), a wire dialect another harness speaks (tests/fakes/plain_dialect.py),
a sandbox backend the server is told to use by name, and a task family. Then the same from an
installed distribution of their own, found by its entry points: `harness-env serve` loads them with
no launcher of ours, a broken one is named and leaves the rest standing. Nothing in the package
names them; docs/architecture.md's recipes are what this file does.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.core import registry
from harness_env.core.capture.dialects import register_dialect, unregister_dialect
from harness_env.core.grading import GradeOutcome
from harness_env.core.harness import AgentOutcome, HarnessBase, LaunchContext
from harness_env.core.plugins import PluginGroup
from harness_env.core.registry import HARNESSES, register_family, register_harness
from harness_env.core.sandbox.backends import SANDBOX_BACKENDS, SandboxSettings, register_sandbox_backend
from harness_env.core.sandbox.base import ExecResult, Sandbox
from harness_env.models import DatasetTaskInfo, RolloutResult
from tests.fakes.loopback import LoopbackServer
from tests.fakes.plain_dialect import PlainLines
from tests.fakes.sandbox import DirSandboxFactory
from tests.server_process import ServerProcess, served_in_process

# The agent: a chat-completions tool loop with one `bash` tool, run in the sandbox by the system's
# Python. It talks to the capture proxy with the per-rollout key, as any harness CLI does.
AGENT = r"""
import json, subprocess, sys, urllib.request
url, key, model, instruction = sys.argv[1:5]
tools = [{"type": "function", "function": {"name": "bash", "description": "run a shell command",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
messages = [{"role": "user", "content": instruction}]
for _ in range(8):
    body = json.dumps({"model": model, "messages": messages, "tools": tools}).encode()
    req = urllib.request.Request(url + "/chat/completions", body, {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    message = json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["message"]
    messages.append(message)
    if not message.get("tool_calls"):
        print(json.dumps({"final": message.get("content") or ""}))
        break
    for call in message["tool_calls"]:
        out = subprocess.run(["bash", "-c", json.loads(call["function"]["arguments"])["command"]], capture_output=True, text=True)
        print(json.dumps({"tool": call["function"]["name"]}), flush=True)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": out.stdout + out.stderr})
"""


class LoopHarness(HarnessBase):
    """A harness from outside: only what the Harness protocol asks (core/harness.py)."""

    name = "outside-loop"
    capabilities = ("tool_calls", "token_capture")
    agent = AGENT  # the program run in the sandbox

    def version(self) -> str:
        return "1.0"

    def check_installed(self) -> None:
        return None  # the system's Python runs it

    def readonly_paths(self) -> list[str]:
        return []

    def list_tasks(self, dataset: str, split: str | None) -> list[DatasetTaskInfo]:
        return [DatasetTaskInfo(index=0, name=f"{dataset}-hello", path="hello", instruction="make hello.txt")]

    def result_facts(self, result: RolloutResult) -> list[tuple[str, str | dict[str, float] | None]]:
        return [("agent", "outside loop 1.0")]

    async def run_agent(self, ctx: LaunchContext, sandbox: Sandbox, stop: asyncio.Event) -> tuple[ExecResult, AgentOutcome]:
        outcome = AgentOutcome(tool_calls=0)

        def read(line: str) -> None:
            event = json.loads(line) if line.startswith("{") else {}
            outcome.events += 1
            outcome.tool_calls = (outcome.tool_calls or 0) + ("tool" in event)
            outcome.final_text = event.get("final", outcome.final_text)

        req = ctx.request
        argv = ["python3", "-c", self.agent, ctx.proxy_base_url, ctx.session_key, req.endpoint.model, req.task.instruction]
        r = await sandbox.exec(argv, timeout=req.agent_timeout_s, on_stdout_line=read, stop=stop)
        return r, outcome


# The same loop in the made-up dialect: its own route with the model in the path, its own key
# header, a prompt and tool names for a request, the calls in the answer.
PLAIN_AGENT = r"""
import json, subprocess, sys, urllib.request
url, key, model, instruction = sys.argv[1:5]
root = url.removesuffix("/v1")
earlier = []
for _ in range(8):
    body = json.dumps({"prompt": instruction, "earlier": earlier, "tools": ["bash"]}).encode()
    req = urllib.request.Request(f"{root}/plain/{model}:complete", body, {"x-plain-key": key, "Content-Type": "application/json"})
    answer = json.load(urllib.request.urlopen(req, timeout=60))
    if not answer["calls"]:
        print(json.dumps({"final": answer["text"]}))
        break
    for call in answer["calls"]:
        command = json.loads(call["arguments"])["command"]
        out = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        earlier.append({"said": "$ " + command, "heard": out.stdout + out.stderr})
        print(json.dumps({"tool": call["name"]}), flush=True)
"""


class PlainLoopHarness(LoopHarness):
    """A harness from outside that speaks a dialect from outside."""

    name = "outside-plain"
    dialect = PlainLines.name
    agent = PLAIN_AGENT


class WordGrader:
    def __init__(self, word: str) -> None:
        self.word = word

    async def grade(self, sandbox: Sandbox, request: RolloutRequest) -> GradeOutcome:
        r = await sandbox.exec("cat word.txt 2>/dev/null", timeout=30)
        return GradeOutcome(reward=1.0 if r.stdout.strip() == self.word else 0.0, source="judge", evidence={"read": r.stdout})


class WordOptions(BaseModel):
    """outside-word: the agent writes the word; the grader reads it back."""

    word: str = Field("hello", title="the word to write")


class WordFamily:
    """A task family from outside (families/base.py): the agent writes a word; the grader reads it."""

    name = "outside-word"
    options_model = WordOptions
    instruction_label = "anything (the family writes the instruction)"
    instruction_key = "say"  # a record {"say": "apple"} is one of this family's
    record_keys = ("task_id", "say", "word")
    request_keys = ("agent_timeout_s",)
    path_keys = ()
    example = None

    def prepare(self, request: RolloutRequest, *, trusted: bool) -> RolloutRequest:
        word = str(request.family_options.get("word") or "hello")
        task = request.task.model_copy(update={"instruction": f"Write the word {word} into word.txt."})
        return request.model_copy(update={"task": task})

    def grader(self, request: RolloutRequest) -> WordGrader:
        return WordGrader(str(request.family_options.get("word") or "hello"))

    def reference_image(self, family_options: dict) -> None:
        return None


@pytest.fixture
def outside() -> Iterator[DirSandboxFactory]:
    """The three registered as a plug-in's own package would register them; the test's sandbox
    factory yielded so the test sees what it made."""
    factory = DirSandboxFactory()
    register_harness(LoopHarness.name, LoopHarness)
    register_dialect(PlainLines())
    register_harness(PlainLoopHarness.name, PlainLoopHarness)
    register_sandbox_backend("test-dir", lambda settings: factory)
    register_family(WordFamily.name, lambda: WordFamily)
    yield factory
    del HARNESSES[LoopHarness.name], HARNESSES[PlainLoopHarness.name], SANDBOX_BACKENDS["test-dir"]
    unregister_dialect(PlainLines.name)
    registry._FAMILY_LOADERS.pop(WordFamily.name)  # no unregister: a plug-in stays for its process's life


def _request(policy_server, script: list[dict], **kw) -> RolloutRequest:
    policy_server.policy.scripts["m"] = script
    return RolloutRequest(endpoint=Endpoint(base_url=policy_server.base_url, model="m"), agent_timeout_s=60, **kw)


async def test_an_outside_harness_runs_in_the_default_sandbox(outside, policy_server):
    task = Task(instruction="make hello.txt", verify=["grep -qx hello hello.txt"])
    res = await run_rollout(_request(policy_server, [{"bash": "echo hello > hello.txt"}, {"text": "done"}], task=task, harness=LoopHarness.name))
    assert res.error is None, res.error
    assert res.reward == 1.0 and res.harness == LoopHarness.name and res.agent_final_text == "done" and res.agent_tool_calls == 1
    assert len(res.proxy_turns) == 2 and res.capture_level == "tokens"  # captured like any harness's
    assert res.sandbox_backend in ("bwrap", "plain") and not outside.made


async def test_an_outside_harness_speaking_an_outside_dialect_is_captured_from_the_engine(outside, policy_server):
    task = Task(instruction="make hello.txt", verify=["grep -qx hello hello.txt"])
    res = await run_rollout(_request(policy_server, [{"bash": "echo hello > hello.txt"}, {"text": "done"}], task=task, harness=PlainLoopHarness.name))
    assert res.error is None, res.error
    assert res.reward == 1.0 and res.agent_final_text == "done" and res.agent_tool_calls == 1
    # Translated to the engine's chat completions and recorded from its token ids, like any dialect.
    [first, second] = [t for t in res.proxy_turns if t.purpose == "policy"]
    sent = policy_server.policy.sent
    assert first.prompt_token_ids == sent[-2].prompt_token_ids and first.completion_token_ids == sent[-2].completion_token_ids
    assert second.completion_text == "done" and res.capture_level == "tokens"


async def test_an_outside_family_grades_what_an_outside_harness_made(outside, policy_server):
    script = [{"bash": "printf apple > word.txt"}, {"text": "written"}]
    res = await run_rollout(
        _request(policy_server, script, task=Task(instruction="-"), harness=LoopHarness.name, task_family=WordFamily.name, family_options={"word": "apple"})
    )
    assert res.error is None, res.error
    assert res.reward == 1.0 and res.reward_source == "judge" and res.grading == {"read": "apple"}
    assert policy_server.policy.tool_requests()[0]["messages"][0]["content"] == "Write the word apple into word.txt."  # as prepared


def test_the_web_form_offers_an_outside_family_s_options(outside):
    from harness_env.server.web.form import family_controls, task_families, to_args

    assert WordFamily.name in task_families() and [c.name for c in family_controls()[WordFamily.name][1]] == ["word"]
    args = to_args({"base_url": "http://127.0.0.1:9/v1", "model": "m", "instruction": "-", "task_family": WordFamily.name, WordFamily.name: {"word": " pear "}})
    assert args.task_family == WordFamily.name and args.family_options == {"word": "pear"}


def test_an_outside_family_s_records_are_read_as_it_declares(outside, tmp_path):
    from harness_env.evals.tasks import load_tasks, task_request

    (tmp_path / "tasks.jsonl").write_text(json.dumps({"task_id": "t1", "say": "-", "word": "pear", "agent_timeout_s": 45, "secret": "x"}) + "\n")
    (task,) = load_tasks(tmp_path)
    request = RolloutRequest.model_validate(task_request(task, {"harness": LoopHarness.name, "endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}}))
    assert request.task_family == WordFamily.name and request.family_options == {"word": "pear"} and request.agent_timeout_s == 45


async def test_a_server_told_an_outside_backend_runs_its_rollouts_there(outside, policy_server, tmp_path):
    from harness_env.server.app import create_app

    make_app = partial(create_app, data_dir=tmp_path / "data", sandbox_backend="test-dir")
    policy_server.policy.scripts["m"] = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]
    body = {
        "instruction": "make hello.txt",
        "verify": ["grep -qx hello hello.txt"],
        "base_url": policy_server.base_url,
        "model": "m",
        "harness": LoopHarness.name,
        "agent_timeout_s": 60,
    }
    async with served_in_process(lambda url: make_app(public_url=url)) as url, httpx.AsyncClient(base_url=url, timeout=120) as client:
        health = (await client.get("/health")).json()
        r = await client.post("/rollout", json=body)
        listed = (await client.get(f"/{LoopHarness.name}/tasks", params={"dataset": "d"})).json()
        none = await client.get("/whitebox/tasks")
        unknown = await client.get("/nope/tasks")
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["error"] is None, result["error"]
    assert result["reward"] == 1.0 and result["sandbox_backend"] == "test-dir" and result["files"]["hello.txt"] == "hello\n"
    (sandbox,) = outside.made
    assert not sandbox.root.exists()  # closed
    assert [(t["index"], t["name"]) for t in listed] == [(0, "d-hello")]
    assert none.status_code == 422 and "brings no tasks" in none.text and unknown.status_code == 404
    assert health["sandbox_backend"] == "test-dir"


def test_an_unknown_backend_stops_the_server_at_start(tmp_path):
    from harness_env.core.errors import InvalidRequestError
    from harness_env.server.app import create_app

    with pytest.raises(InvalidRequestError, match="unknown sandbox backend 'nowhere'"):
        create_app(public_url="http://127.0.0.1:9", data_dir=tmp_path, sandbox_backend="nowhere")
    assert SandboxSettings().use_bwrap is None


# -- the same, from a distribution of their own, by entry points ------------------------------------
# What another distribution's package holds: the harnesses above (named by their module path), the
# plain dialect with an API of its own that an upstream may speak (pass-through), and a sandbox
# backend with its own directory layout and the sweep that knows it.
PLUGIN_MODULE = '''
"""outside-plugins: a dialect with its own API, and a sandbox backend that sweeps its own leftovers."""
import os
import uuid
from pathlib import Path

from harness_env.core.capture.dialects import NativeAPI
from harness_env.core.capture.dialects.native import add_call
from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.backends import SandboxBackend
from tests.fakes.plain_dialect import PlainLines
from tests.fakes.sandbox import DirSandbox


class PlainAnswerReader:
    """A native plain answer ({"text", "calls", "finish"}) into the turn."""

    def __init__(self, draft):
        self.draft = draft

    def event(self, obj, data):
        self.whole(obj)

    def whole(self, obj):
        self.draft.text_parts.append(str(obj.get("text") or ""))
        for call in obj.get("calls") or []:
            add_call(self.draft, call.get("id"), call.get("name"), str(call.get("arguments") or ""))
        self.draft.finish_reason = obj.get("finish") or self.draft.finish_reason


class PlainWithItsOwnAPI(PlainLines):
    native = NativeAPI(wire_api="plain", auth_header="x-plain-key", auth_template="{key}", max_tokens=((), "max_tokens"), reader=PlainAnswerReader)


class Box(DirSandbox):
    backend = "outside-box"


def _boxes():
    return Path(os.environ["HARNESS_ENV_SANDBOX_DIR"])


def make_box(*, readonly_paths, limits, capture_socket):
    """A box: box-<id> with its owner's pid in owner.pid (this backend's layout, nobody else's)."""
    root = _boxes() / f"box-{uuid.uuid4().hex}"
    root.mkdir(parents=True)
    (root / "owner.pid").write_text(str(os.getpid()))
    return Box(root)


def sweep():
    notes = []
    for box in sorted(_boxes().glob("box-*")):
        pid = int((box / "owner.pid").read_text())
        if not os.path.exists(f"/proc/{pid}"):
            safefs.remove_tree(box)
            notes.append(f"outside-box: removed {box.name} of dead owner {pid}")
    return notes


BACKEND = SandboxBackend("outside-box", lambda settings: make_box, sweep=sweep)
'''

ENTRY_POINTS = """
[harness_env.harnesses]
outside-loop = tests.test_plugins_from_outside:LoopHarness
outside-plain = tests.test_plugins_from_outside:PlainLoopHarness
broken = outside_plugins:not_there

[harness_env.dialects]
plain = outside_plugins:PlainWithItsOwnAPI

[harness_env.sandbox_backends]
outside-box = outside_plugins:BACKEND
"""


def installed_distribution(site: Path, name: str, entry_points: str, modules: dict[str, str]) -> Path:
    """`site` holding distribution `name` 1.0 as an installer leaves one: its modules, and its
    .dist-info with METADATA, entry_points.txt and RECORD."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    for module, text in modules.items():
        (site / f"{module}.py").write_text(text)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    files = [f"{m}.py" for m in modules] + [f"{info.name}/{f}" for f in ("METADATA", "entry_points.txt", "RECORD")]
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    return site


def test_a_broken_entry_point_is_named_and_the_others_load(tmp_path, monkeypatch):
    site = installed_distribution(
        tmp_path / "site",
        "outside-two",
        "[harness_env.test_group]\ngood = good_plugin:Thing\nbad = bad_plugin:Thing\n",
        {"good_plugin": "class Thing:\n    name = 'good'\n", "bad_plugin": "raise ImportError('needs the frobnicate extra')\n"},
    )
    monkeypatch.syspath_prepend(str(site))
    registered: list[str] = []
    group = PluginGroup("harness_env.test_group", lambda cls: registered.append(cls.name))
    group.load()
    group.load()  # once
    assert registered == ["good"]
    (failure,) = group.failures
    assert "entry point 'bad' = 'bad_plugin:Thing'" in failure and "distribution outside-two 1.0" in failure
    assert "ImportError: needs the frobnicate extra" in failure
    assert failure in group.unknown("thing", "bad", ["good"]) and "choose one of: good" in group.unknown("thing", "bad", ["good"])


def plain_upstream(answers: list[dict], seen: list[tuple[str, dict, dict]]) -> FastAPI:
    """A loopback upstream that speaks the plain API itself: scripted answers, what it was sent kept."""
    app = FastAPI()

    @app.post("/v1/plain/{model}:complete")  # the endpoint's base URL ends in /v1
    async def complete(model: str, request: Request) -> dict:
        seen.append((model, dict(request.headers), await request.json()))
        return answers[len(seen) - 1]

    return app


def test_an_installed_distribution_s_plug_ins_are_served_by_harness_env_serve(tmp_path_factory):
    from harness_env.client import HarnessEnv

    tmp_path = tmp_path_factory.mktemp("ep")  # short: the server's capture socket lives below it

    site = installed_distribution(tmp_path / "site", "outside-plugins", ENTRY_POINTS, {"outside_plugins": PLUGIN_MODULE})
    sandboxes = tmp_path / "sandboxes"
    sandboxes.mkdir()
    owner = subprocess.Popen(["true"])
    owner.wait()  # dead: what it left is a dead owner's
    left = sandboxes / "box-left-by-a-killed-server"
    (left / "ws").mkdir(parents=True)
    (left / "owner.pid").write_text(str(owner.pid))
    answers = [
        {"text": "", "calls": [{"id": "c1", "name": "bash", "arguments": json.dumps({"command": "echo hello > hello.txt"})}], "finish": "tool_calls"},
        {"text": "done", "calls": [], "finish": "stop"},
    ]
    seen: list[tuple[str, dict, dict]] = []
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(Path(__file__).parents[1])])}
    with LoopbackServer(plain_upstream(answers, seen)) as upstream:
        server = ServerProcess(sandboxes, "--sandbox-backend", "outside-box", env=env, start_timeout_s=120)
        try:
            swept = not left.exists()  # by the backend's own sweep, at start
            client = HarnessEnv(server.url)
            listed = client.list_tasks("d", harness=LoopHarness.name)
            generic = httpx.get(server.url + "/tasks", params={"harness": LoopHarness.name, "dataset": "e"})
            harnesses = [h.name for h in client.list_harnesses()]
            result = client.run_rollout(
                instruction="make hello.txt",
                verify=["grep -qx hello hello.txt"],
                base_url=upstream.base_url,
                api_key="sk-plain-upstream-5150",
                model="m",
                wire_api="plain",
                mode="black_box",
                harness=PlainLoopHarness.name,
                agent_timeout_s=60,
            )
            broken = httpx.post(server.url + "/rollout", json={"instruction": "-", "base_url": "http://127.0.0.1:9/v1", "model": "m", "harness": "broken"})
            server.assert_no_rollout_left()
        finally:
            log = server.stop()
    assert swept and "outside-box: removed box-left-by-a-killed-server of dead owner" in log
    # The outside harness's tasks, through the generic routes, by the client and by name.
    assert [(t.index, t.name) for t in listed] == [(0, "d-hello")] and [t["name"] for t in generic.json()] == ["e-hello"]
    assert {"pi", "whitebox", LoopHarness.name, PlainLoopHarness.name} <= set(harnesses)  # the built-ins stand beside them
    # The outside dialect passed through to its own API: the harness's body as sent, the real key in
    # the dialect's own header (never the capture key), the turns recorded from the native answers.
    assert result.error is None, result.error
    assert result.reward == 1.0 and result.sandbox_backend == "outside-box" and result.agent_final_text == "done"
    assert [(model, headers["x-plain-key"], body["prompt"]) for model, headers, body in seen] == [("m", "sk-plain-upstream-5150", "make hello.txt")] * 2
    assert seen[1][2]["earlier"] == [{"said": "$ echo hello > hello.txt", "heard": ""}]
    turns = [t for t in result.proxy_turns if t.purpose == "policy"]
    assert [t.completion_text for t in turns] == ["", "done"] and turns[0].tool_calls[0]["function"]["name"] == "bash"
    assert all(not t.completion_token_ids for t in turns)  # a native upstream gives no token ids
    # A broken plug-in: named with its distribution where it is asked for, and the server stood.
    assert broken.status_code == 422 and "entry point 'broken'" in broken.text and "outside-plugins 1.0" in broken.text
