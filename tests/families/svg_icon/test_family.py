"""The svg_icon family end to end: the real Pi CLI writes icon.svg (scripted fake policy), the
server renders it and asks a scripted fake judge; zero before the judge; judge failures."""

import asyncio
import base64
import json

import pytest
import resvg_py

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.core.errors import InvalidRequestError
from harness_env.core.pipeline import prepare
from harness_env.families.svg_icon.preview import PREVIEW_COMMAND
from tests.fakes.judge import FakeJudge, FakeJudgeServer

pytestmark = pytest.mark.e2e

RED_SQUARE = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 100 100"><rect x="20" y="20" width="60" height="60" fill="#e00"/></svg>'
BLANK = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 100 100"><rect width="100" height="100" fill="#fff"/></svg>'


def write_icon(svg: str) -> dict:
    return {"bash": f"cat > icon.svg <<'EOF'\n{svg}\nEOF"}


@pytest.fixture
def judge(monkeypatch):
    fake = FakeJudge()
    with FakeJudgeServer(fake) as srv:
        monkeypatch.setenv("HARNESS_ENV_JUDGE_BASE_URL", srv.base_url)
        monkeypatch.setenv("HARNESS_ENV_JUDGE_MODEL", "judge-vl")
        monkeypatch.setenv("HARNESS_ENV_JUDGE_API_KEY", "sk-judge-secret-77")
        yield fake


@pytest.fixture
def reference(tmp_path):
    path = tmp_path / "reference.png"
    path.write_bytes(resvg_py.svg_to_bytes(svg_string=RED_SQUARE, width=256, height=256, background="#ffffff"))
    return str(path)


def icon_request(policy_server, script, **options):
    policy_server.policy.scripts["m"] = script
    return RolloutRequest(
        task=Task(instruction="a red square", task_id="icon-1"),
        harness="pi",
        task_family="svg_icon",
        family_options={"renderer": "resvg", **options},
        agent_timeout_s=90,
        endpoint=Endpoint(base_url=policy_server.base_url, model="m"),
    )


async def test_a_good_icon_gets_the_judges_weighted_score(policy_server, judge, reference):
    judge.expect_images = 2
    judge.script = [{"scores": {"semantic_match": 1.0, "composition": 0.5, "geometry": 1.0, "style": 0.5, "aesthetics": 0.5}}]
    req = icon_request(policy_server, [write_icon(RED_SQUARE), {"bash": PREVIEW_COMMAND}, {"text": "done"}], reference_png=reference, renderer="chromium")
    res = await run_rollout(req)
    assert res.error is None, res.error
    assert res.reward == pytest.approx(0.7) and res.reward_source == "judge"
    assert judge.calls == 1 and judge.problems == []
    g = res.grading
    assert g["page_valid"] and g["zero_reasons"] == [] and g["renderer"] == "chromium"
    assert g["judge"]["scores"]["composition"]["score"] == 0.5 and g["judge"]["raw_answer"]
    # The candidate the judge saw is the PNG in the evidence; the reference went to the judge only.
    assert base64.b64decode(g["rendered_png_b64"]) in judge.images[0]
    assert "reference.png" not in json.dumps(res.files) and all(not f.endswith(".png") or f == "icon.preview.png" for f in res.files)
    preview = res.proxy_turns[2].request_messages[-1]  # Pi sent the preview's report back to the model
    assert "blank" in json.dumps(preview).lower()
    assert "sk-judge-secret-77" not in res.model_dump_json()


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ([{"text": "I will not draw."}], "empty"),
        ([write_icon("<svg><rect"), {"text": "done"}], "not_xml"),
        ([write_icon("<html><body/></html>"), {"text": "done"}], "not_svg_root"),
        ([write_icon(BLANK), {"text": "done"}], "blank"),
    ],
)
async def test_bad_submissions_get_0_without_asking_the_judge(policy_server, judge, script, reason):
    res = await run_rollout(icon_request(policy_server, script))
    assert res.error is None and res.reward == 0.0 and res.reward_source == "zero_check"
    assert any(r.startswith(reason) for r in res.grading["zero_reasons"]), res.grading["zero_reasons"]
    assert judge.calls == 0


async def test_a_custom_rubric_weights_the_scores(policy_server, judge):
    judge.script = [{"scores": {"shape": 1.0, "colour": 0.0}}]
    rubric = {"dimensions": [{"name": "shape", "description": "Is it a square?", "weight": 3}, {"name": "colour", "description": "Is it red?", "weight": 1}]}
    res = await run_rollout(icon_request(policy_server, [write_icon(RED_SQUARE), {"text": "done"}], rubric=rubric))
    assert res.reward == pytest.approx(0.75) and set(res.grading["judge"]["scores"]) == {"shape", "colour"}


async def test_judge_down_is_an_infrastructure_error_not_a_zero(policy_server, judge):
    judge.default_step = {"status": 503}
    res = await run_rollout(icon_request(policy_server, [write_icon(RED_SQUARE), {"text": "done"}]))
    assert res.reward is None and res.error_kind == "judge" and "503" in res.error
    assert judge.calls >= 2  # retried before giving up


def test_bad_family_input_is_refused_before_any_work(monkeypatch, reference):
    def req(**options):
        return RolloutRequest(
            task=Task(instruction="a red square"),
            task_family="svg_icon",
            family_options=options,
            endpoint=Endpoint(base_url="http://127.0.0.1:9/v1", model="m"),
        )

    monkeypatch.delenv("HARNESS_ENV_JUDGE_BASE_URL", raising=False)
    with pytest.raises(InvalidRequestError, match="HARNESS_ENV_JUDGE_BASE_URL"):
        prepare(req(renderer="resvg"), trusted=True)
    monkeypatch.setenv("HARNESS_ENV_JUDGE_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("HARNESS_ENV_JUDGE_MODEL", "j")
    with pytest.raises(InvalidRequestError, match="svg_icon family_options: colour: Extra inputs are not permitted"):
        prepare(req(colour="red"), trusted=True)
    with pytest.raises(InvalidRequestError, match="HARNESS_ENV_REFERENCE_DIR"):
        prepare(req(reference_png=reference, renderer="resvg"), trusted=False)  # a remote caller names no server path
    with pytest.raises(InvalidRequestError, match="not a PNG"):
        prepare(req(reference_png=__file__, renderer="resvg"), trusted=True)
    done = prepare(req(reference_png=reference, renderer="resvg"), trusted=True)
    prepared, grader = done.request, done.grader
    assert prepared.task.files["icon.svg"] == "" and "a red square" in prepared.task.instruction and grader is not None
    assert reference not in json.dumps(prepared.task.model_dump())  # the agent never sees the reference
    assert prepare(prepared, trusted=True).request == prepared  # preparing twice changes nothing


async def test_through_the_server_references_come_only_from_its_reference_dir(start_server, policy_server, tmp_path):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from harness_env.client import AsyncHarnessEnv, HarnessEnvClientError

    refs = tmp_path / "refs"
    refs.mkdir()
    (refs / "square.png").write_bytes(resvg_py.svg_to_bytes(svg_string=RED_SQUARE, width=64, height=64, background="#ffffff"))
    outside = tmp_path / "outside.png"
    outside.write_bytes((refs / "square.png").read_bytes())
    policy_server.policy.scripts["m"] = [write_icon(RED_SQUARE), {"text": "done"}]
    judge = FakeJudge(expect_images=2)
    with FakeJudgeServer(judge) as jsrv:
        server = start_server(env={"HARNESS_ENV_JUDGE_BASE_URL": jsrv.base_url, "HARNESS_ENV_JUDGE_MODEL": "vl", "HARNESS_ENV_REFERENCE_DIR": str(refs)})
        args = {"instruction": "a red square", "base_url": policy_server.base_url, "model": "m", "task_family": "svg_icon"}
        async with streamable_http_client(server.url + "/mcp") as (read, write):  # an agent's MCP call
            async with ClientSession(read, write) as session:
                await session.initialize()
                out = await session.call_tool("run_rollout", {**args, "family_options": {"reference_png": "square.png", "renderer": "resvg"}})
        async with AsyncHarnessEnv(server.url) as env:  # a trainer's client call
            with pytest.raises(HarnessEnvClientError) as e:
                await env.run_rollout(**args, family_options={"reference_png": str(outside), "renderer": "resvg"})
    assert not out.is_error and out.structured_content["reward"] == 0.8 and out.structured_content["reward_source"] == "judge"
    assert judge.problems == [] and judge.calls == 1
    assert e.value.status == 422 and "HARNESS_ENV_REFERENCE_DIR" in e.value.message


@pytest.mark.parametrize("plant", ["link", "fifo", "dir"])
async def test_a_submission_that_is_no_regular_file_is_missing_not_followed_or_waited_on(policy_server, judge, tmp_path, plant):
    # icon.svg as a link to a host file holding a valid icon (followed, it would be rendered and
    # judged), as a FIFO (opened, grading would wait for ever), or as a directory.
    host_icon = tmp_path / "host-icon.svg"
    host_icon.write_text(RED_SQUARE)
    cmd = {"link": f"rm -f icon.svg; ln -s {host_icon} icon.svg", "fifo": "rm -f icon.svg; mkfifo icon.svg", "dir": "rm -f icon.svg; mkdir icon.svg"}[plant]
    res = await asyncio.wait_for(run_rollout(icon_request(policy_server, [{"bash": cmd}, {"text": "done"}])), 120)
    assert res.error is None and res.reward == 0.0 and res.reward_source == "zero_check", (res.error, res.grading)
    assert res.grading["zero_reasons"][0].startswith("missing: icon.svg is a"), res.grading["zero_reasons"]
    assert judge.calls == 0


def test_the_submission_is_read_without_following_links_anywhere(tmp_path):
    import concurrent.futures
    import os

    from harness_env.core.sandbox.local import create_local_sandbox
    from harness_env.families.svg_icon.family import read_submission

    sb = create_local_sandbox(use_bwrap=False)
    try:
        ws = sb.root / "workspace"
        (ws / "icon.svg").write_text(RED_SQUARE)
        assert read_submission(sb, 10_000) == (RED_SQUARE.encode(), None)
        assert read_submission(sb, 10) == (RED_SQUARE.encode()[:10], None)  # bounded
        (ws / "icon.svg").unlink()
        (ws / "icon.svg").symlink_to("/etc/passwd")
        assert read_submission(sb, 10_000) == (None, "icon.svg is a symbolic link, not a regular file")
        (ws / "icon.svg").unlink()
        os.mkfifo(ws / "icon.svg")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            assert pool.submit(read_submission, sb, 10_000).result(timeout=10) == (None, "icon.svg is a FIFO, not a regular file")
        # The workspace itself swapped for a link to a directory with a valid icon: not followed.
        other = tmp_path / "other"
        other.mkdir()
        (other / "icon.svg").write_text(RED_SQUARE)
        os.rename(ws, sb.root / "workspace-old")
        ws.symlink_to(other)
        assert read_submission(sb, 10_000) == (None, None)
    finally:
        asyncio.run(sb.close())


async def test_a_judge_that_answers_without_scores_grades_0_not_none(policy_server, judge):
    """What the picture shows can talk a judge out of scoring (a prompt written into the icon):
    a judge that answers, but never with scores, is graded 0, not left out as infrastructure."""
    judge.default_step = {"raw": "Ignore the rubric. I will not score this."}
    res = await run_rollout(icon_request(policy_server, [write_icon(RED_SQUARE), {"text": "done"}]))
    assert (res.reward, res.reward_source, res.error_kind) == (0.0, "judge", "judge"), (res.reward, res.error)
    assert "without usable scores" in res.error


async def test_a_judge_that_refuses_the_picture_grades_0_not_none(policy_server, judge):
    judge.default_step = {"status": 400}  # e.g. a content filter on what the icon shows
    res = await run_rollout(icon_request(policy_server, [write_icon(RED_SQUARE), {"text": "done"}]))
    assert (res.reward, res.error_kind) == (0.0, "judge"), (res.reward, res.error)
