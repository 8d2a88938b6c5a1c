"""The SVG icon family's vision-language judge against a scripted fake judge (tests/fakes/judge.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import socket
import threading

import pytest
from pydantic import ValidationError

from harness_env.families.svg_icon.judge import (
    DEFAULT_RUBRIC,
    Judge,
    JudgeAnswerError,
    JudgeConfig,
    JudgeConfigError,
    Rubric,
    RubricDimension,
    build_judge_request,
    parse_judge_answer,
)
from harness_env.families.svg_icon.pngcodec import encode_png
from tests.fakes.judge import FakeJudge, FakeJudgeServer

KEY = "sk-judge-SECRET-4242"


def png(r: int, g: int, b: int, size: int = 4) -> bytes:
    """A tiny valid RGB PNG of one colour."""
    return encode_png(size, size, bytes([r, g, b]) * size * size)


CANDIDATE, REFERENCE = png(255, 0, 0), png(0, 0, 255)
EVIDENCE = {"renderer": "resvg", "width": 4, "height": 4, "blank": False}


def judge_for(srv_or_url, *, key: str = KEY, timeout: float = 5, concurrency: int = 4, options=None, **kw) -> Judge:
    url = srv_or_url if isinstance(srv_or_url, str) else srv_or_url.base_url
    env = {
        "HARNESS_ENV_JUDGE_BASE_URL": url,
        "HARNESS_ENV_JUDGE_MODEL": "fake-vlm",
        "HARNESS_ENV_JUDGE_API_KEY": key,
        "HARNESS_ENV_JUDGE_TIMEOUT": str(timeout),
        "HARNESS_ENV_JUDGE_CONCURRENCY": str(concurrency),
    }
    if options is not None:
        env["HARNESS_ENV_JUDGE_REQUEST_OPTIONS"] = json.dumps(options)
    kw.setdefault("backoff_base_s", 0.01)
    kw.setdefault("backoff_max_s", 0.05)
    return Judge(JudgeConfig.from_env(env), **kw)


def free_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"


def answer(scores: dict[str, float]) -> str:
    return json.dumps({k: {"reason": "r", "score": v} for k, v in scores.items()})


# ----------------------------------------------------------------------------------- rubric


def test_default_rubric_has_five_equal_dimensions():
    assert DEFAULT_RUBRIC.names == ["semantic_match", "composition", "geometry", "style", "aesthetics"]
    assert {d.weight for d in DEFAULT_RUBRIC.dimensions} == {1.0}
    assert all(d.description for d in DEFAULT_RUBRIC.dimensions)


@pytest.mark.parametrize(
    "dims,match",
    [
        ([], "at least 1"),
        ([{"name": f"d{i}", "description": "x"} for i in range(21)], "at most 20"),
        ([{"name": "a", "description": "x"}, {"name": "a", "description": "y"}], "repeated: a"),
        ([{"name": "a", "description": "x", "weight": 0}], "greater than 0"),
        ([{"name": "a", "description": "x", "weight": -1}], "greater than 0"),
        ([{"name": "a", "description": "x", "weight": math.inf}], "less than or equal|finite"),
        ([{"name": "a", "description": "x", "weight": math.nan}], "finite|greater than"),
        ([{"name": "Bad Name", "description": "x"}], "pattern"),
        ([{"name": "a", "description": ""}], "at least 1 character"),
    ],
)
def test_bad_rubrics_are_refused(dims, match):
    with pytest.raises(ValidationError, match=match):
        Rubric(dimensions=dims)


# ----------------------------------------------------------------------------------- builder


def _parts(body):
    return body["messages"][1]["content"]


def test_request_labels_reference_and_candidate_images():
    body = build_judge_request("a red heart", CANDIDATE, REFERENCE, EVIDENCE, DEFAULT_RUBRIC, "m", {})
    assert body["model"] == "m" and body["temperature"] == 0
    assert body["messages"][0]["role"] == "system" and "semantic_match (weight 1)" in body["messages"][0]["content"]
    parts = _parts(body)
    kinds = [p["type"] for p in parts]
    assert kinds.count("image_url") == 2
    i_ref, i_cand = [i for i, k in enumerate(kinds) if k == "image_url"]
    assert "REFERENCE" in parts[i_ref - 1]["text"] and "CANDIDATE" in parts[i_cand - 1]["text"]
    assert parts[i_ref]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(REFERENCE).decode()
    assert parts[i_cand]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(CANDIDATE).decode()
    assert "a red heart" in parts[0]["text"]
    assert any('"renderer": "resvg"' in p.get("text", "") for p in parts)
    rf = body["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["strict"] is True
    schema = rf["json_schema"]["schema"]
    assert schema["required"] == DEFAULT_RUBRIC.names and schema["additionalProperties"] is False
    dim = schema["properties"]["geometry"]
    assert dim["required"] == ["reason", "score"] and dim["properties"]["score"] == {
        "type": "number",
        "minimum": 0,
        "maximum": 1,
        "description": dim["properties"]["score"]["description"],
    }


def test_request_without_reference_says_so_and_has_one_image():
    body = build_judge_request("x", CANDIDATE, None, {}, DEFAULT_RUBRIC, "m", None)
    parts = _parts(body)
    assert [p["type"] for p in parts].count("image_url") == 1
    assert any("no reference image" in p.get("text", "") for p in parts)


def test_options_are_merged_last():
    body = build_judge_request("x", CANDIDATE, None, {}, DEFAULT_RUBRIC, "m", {"temperature": 0.3, "max_tokens": 900})
    assert body["temperature"] == 0.3 and body["max_tokens"] == 900


def test_non_png_images_are_a_programming_error():
    with pytest.raises(ValueError, match="candidate image must be PNG"):
        build_judge_request("x", b"<svg/>", None, {}, DEFAULT_RUBRIC, "m", None)
    with pytest.raises(ValueError, match="reference image must be PNG"):
        build_judge_request("x", CANDIDATE, b"GIF89a", {}, DEFAULT_RUBRIC, "m", None)


def test_huge_evidence_is_bounded():
    body = build_judge_request("x", CANDIDATE, None, {"log": "y" * 100_000}, DEFAULT_RUBRIC, "m", None)
    assert len(json.dumps(body)) < 20_000


# ----------------------------------------------------------------------------------- parser


def test_weighted_reward():
    rubric = Rubric(dimensions=[RubricDimension(name="a", description="A", weight=3), RubricDimension(name="b", description="B", weight=1)])
    scores = parse_judge_answer(answer({"a": 1.0, "b": 0.0}), rubric)
    assert scores.reward == pytest.approx(0.75)
    assert scores.per_dimension["a"] == (1.0, "r") and scores.per_dimension["b"].score == 0.0
    assert dict(scores) == scores.per_dimension and [(k, s) for k, (s, _) in scores.items()] == [("a", 1.0), ("b", 0.0)]


def test_fenced_and_surrounded_json_is_accepted():
    text = answer({n: 0.5 for n in DEFAULT_RUBRIC.names})
    assert parse_judge_answer(f"```json\n{text}\n```", DEFAULT_RUBRIC).reward == pytest.approx(0.5)
    assert parse_judge_answer(f"Here you go:\n{text}\nThanks", DEFAULT_RUBRIC).reward == pytest.approx(0.5)


@pytest.mark.parametrize(
    "text,match",
    [
        ("not json", "not a JSON object"),
        ("[1, 2]", "not a JSON object"),
        (answer({"semantic_match": 0.5}), "'composition' is missing"),
        (answer({n: 1.5 for n in DEFAULT_RUBRIC.names}), r"outside \[0, 1\]"),
        (answer({n: -0.1 for n in DEFAULT_RUBRIC.names}), r"outside \[0, 1\]"),
        (json.dumps({n: {"score": "0.5", "reason": ""} for n in DEFAULT_RUBRIC.names}), "not a finite number"),
        (json.dumps({n: {"score": True, "reason": ""} for n in DEFAULT_RUBRIC.names}), "not a finite number"),
        ('{"semantic_match": {"score": NaN, "reason": ""}}', "not a finite number"),
    ],
)
def test_bad_answers_are_errors(text, match):
    with pytest.raises(JudgeAnswerError, match=match):
        parse_judge_answer(text, DEFAULT_RUBRIC)


# ----------------------------------------------------------------------------------- config


def test_config_from_env_defaults_and_values():
    cfg = JudgeConfig.from_env({})
    assert not cfg.configured and cfg.timeout_s == 60 and cfg.concurrency == 4 and cfg.request_options == {}
    cfg = JudgeConfig.from_env(
        {
            "HARNESS_ENV_JUDGE_BASE_URL": "http://h:1/v1/",
            "HARNESS_ENV_JUDGE_MODEL": "vlm",
            "HARNESS_ENV_JUDGE_API_KEY": KEY,
            "HARNESS_ENV_JUDGE_TIMEOUT": "12.5",
            "HARNESS_ENV_JUDGE_CONCURRENCY": "7",
            "HARNESS_ENV_JUDGE_REQUEST_OPTIONS": '{"max_tokens": 512}',
        }
    )
    assert cfg.configured and cfg.base_url == "http://h:1/v1" and cfg.timeout_s == 12.5 and cfg.concurrency == 7
    assert cfg.request_options == {"max_tokens": 512} and cfg.api_key.get_secret_value() == KEY


def test_config_reads_os_environ(monkeypatch):
    monkeypatch.setenv("HARNESS_ENV_JUDGE_BASE_URL", "http://h:1/v1")
    monkeypatch.setenv("HARNESS_ENV_JUDGE_MODEL", "vlm")
    assert JudgeConfig.from_env().configured


@pytest.mark.parametrize(
    "env,match",
    [
        ({"HARNESS_ENV_JUDGE_REQUEST_OPTIONS": "{max_tokens: 1"}, "HARNESS_ENV_JUDGE_REQUEST_OPTIONS is not valid JSON"),
        ({"HARNESS_ENV_JUDGE_REQUEST_OPTIONS": "[1]"}, "HARNESS_ENV_JUDGE_REQUEST_OPTIONS must be a JSON object"),
        ({"HARNESS_ENV_JUDGE_TIMEOUT": "soon"}, "HARNESS_ENV_JUDGE_TIMEOUT must be"),
        ({"HARNESS_ENV_JUDGE_TIMEOUT": "-1"}, "HARNESS_ENV_JUDGE_TIMEOUT must be"),
        ({"HARNESS_ENV_JUDGE_TIMEOUT": "nan"}, "HARNESS_ENV_JUDGE_TIMEOUT must be"),
        ({"HARNESS_ENV_JUDGE_CONCURRENCY": "0"}, "HARNESS_ENV_JUDGE_CONCURRENCY must be"),
        ({"HARNESS_ENV_JUDGE_CONCURRENCY": "2.5"}, "HARNESS_ENV_JUDGE_CONCURRENCY must be"),
        ({"HARNESS_ENV_JUDGE_BASE_URL": "ftp://x"}, "HARNESS_ENV_JUDGE_BASE_URL: .*http"),
    ],
)
def test_config_errors_name_the_variable(env, match):
    with pytest.raises(JudgeConfigError, match=match):
        JudgeConfig.from_env({**env, "HARNESS_ENV_JUDGE_API_KEY": KEY})


def test_missing_judge_is_a_clear_error_when_needed():
    with pytest.raises(JudgeConfigError, match="set HARNESS_ENV_JUDGE_BASE_URL and HARNESS_ENV_JUDGE_MODEL"):
        Judge(JudgeConfig.from_env({}))
    with pytest.raises(JudgeConfigError, match="set HARNESS_ENV_JUDGE_MODEL$|set HARNESS_ENV_JUDGE_MODEL "):
        JudgeConfig.from_env({"HARNESS_ENV_JUDGE_BASE_URL": "http://h/v1"}).require()


def test_key_is_not_in_repr():
    cfg = JudgeConfig.from_env({"HARNESS_ENV_JUDGE_BASE_URL": "http://h/v1", "HARNESS_ENV_JUDGE_MODEL": "m", "HARNESS_ENV_JUDGE_API_KEY": KEY})
    for text in (repr(cfg), str(cfg), repr(Judge(cfg)), cfg.model_dump_json()):
        assert KEY not in text


# ----------------------------------------------------------------------------------- judge over HTTP


async def test_good_icon_gets_the_weighted_score():
    fake = FakeJudge(expect_images=2, script=[{"scores": {"semantic_match": 1.0, "composition": 0.5, "geometry": 0.5, "style": 1.0, "aesthetics": 0.0}}])
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv).score("a red heart", CANDIDATE, REFERENCE, EVIDENCE)
    assert fake.problems == []
    assert out.error is None and out.attempts == 1 and out.reward == pytest.approx(0.6)
    assert fake.images == [[REFERENCE, CANDIDATE]]
    assert out.scores.per_dimension["aesthetics"] == (0.0, "fake reason for aesthetics")
    assert json.loads(out.raw_answer)["semantic_match"]["score"] == 1.0
    ev = out.to_evidence(DEFAULT_RUBRIC)
    assert ev["scores"]["composition"] == {"score": 0.5, "reason": "fake reason for composition", "weight": 1.0}
    assert ev["raw_answer"] == out.raw_answer and ev["attempts"] == 1 and ev["seconds"] >= 0 and ev["judge_model"] == "fake-vlm"
    json.dumps(ev)
    # The key is only in the Authorization header.
    assert fake.headers[0]["authorization"] == f"Bearer {KEY}"
    assert KEY not in json.dumps(fake.requests[0])


async def test_no_reference_sends_one_image():
    fake = FakeJudge(expect_images=1)
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv, key="").score("a star", CANDIDATE, None, EVIDENCE)
    assert fake.problems == [] and out.reward == pytest.approx(0.8)
    assert "authorization" not in fake.headers[0]


async def test_custom_rubric_weights_are_applied():
    rubric = Rubric(
        dimensions=[RubricDimension(name="shape", description="right shape", weight=3), RubricDimension(name="colour", description="right colour", weight=1)]
    )
    fake = FakeJudge(script=[{"scores": {"shape": 0.2, "colour": 1.0}}])
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv).score("a red heart", CANDIDATE, REFERENCE, EVIDENCE, rubric)
    assert out.reward == pytest.approx((3 * 0.2 + 1 * 1.0) / 4)
    assert fake.requests[0]["response_format"]["json_schema"]["schema"]["required"] == ["shape", "colour"]
    assert set(out.scores.per_dimension) == {"shape", "colour"}


async def test_request_options_reach_the_judge():
    fake = FakeJudge()
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv, options={"max_tokens": 777, "temperature": 0.1}).score("x", CANDIDATE, None, {})
    assert out.reward is not None and fake.requests[0]["max_tokens"] == 777 and fake.requests[0]["temperature"] == 0.1


async def test_503_then_success_is_retried():
    fake = FakeJudge(script=[{"status": 503}])
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv).score("x", CANDIDATE, REFERENCE, EVIDENCE)
    assert out.reward == pytest.approx(0.8) and out.error is None and out.attempts == 2 and fake.calls == 2
    assert [e.get("status") for e in out.attempt_log] == [503, 200]


@pytest.mark.parametrize("status", [429, 502, 504])
async def test_other_transient_statuses_are_retried(status):
    fake = FakeJudge(script=[{"status": status}, {"status": status}])
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv).score("x", CANDIDATE, None, {})
    assert out.reward is not None and out.attempts == 3


@pytest.fixture
def pauses(monkeypatch) -> list[float]:
    """The pauses the judge asks for between calls (asyncio.sleep on the test's thread, not the fake judge's)."""
    seen: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay, *args, **kw):
        if delay > 0 and threading.current_thread() is threading.main_thread():
            seen.append(delay)
        return await real_sleep(delay, *args, **kw)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return seen


@pytest.mark.parametrize(("retry_after", "pause"), [("0.3", 0.3), ("30", 0.5)])
async def test_retry_after_is_honoured_within_the_cap(pauses, retry_after, pause):
    fake = FakeJudge(script=[{"status": 429, "headers": {"Retry-After": retry_after}}])
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv, backoff_max_s=0.5).score("x", CANDIDATE, None, {})
    assert out.reward is not None and pauses == [pytest.approx(pause)]


async def test_judge_always_503_gives_none_after_bounded_attempts(pauses):
    fake = FakeJudge(default_step={"status": 503})
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv, max_attempts=3).score("x", CANDIDATE, REFERENCE, EVIDENCE)
    assert out.reward is None and out.scores is None and out.attempts == 3 and fake.calls == 3
    assert out.error.startswith("the judge answered HTTP 503")
    assert [e["status"] for e in out.attempt_log] == [503, 503, 503]
    assert len(pauses) == 2 and max(pauses) <= 0.05  # between the calls only, each within backoff_max_s


async def test_judge_down_gives_none(pauses):
    out = await judge_for(free_port_url()).score("x", CANDIDATE, REFERENCE, EVIDENCE)
    assert out.reward is None and out.attempts == 4 and "cannot reach the judge" in out.error
    assert len(pauses) == 3 and max(pauses) <= 0.05  # between the calls only, each within backoff_max_s


async def test_hanging_judge_times_out_and_gives_none():
    fake = FakeJudge(default_step={"hang": 2})
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv, timeout=0.3, max_attempts=2).score("x", CANDIDATE, None, {})
    # Each call cut at its timeout (the fake judge hangs 2 s): the error says so.
    assert out.reward is None and out.attempts == 2 and "did not answer within 0.3 s" in out.error


async def test_timeout_then_success():
    fake = FakeJudge(script=[{"hang": 2}])
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv, timeout=0.3).score("x", CANDIDATE, None, {})
    assert out.reward == pytest.approx(0.8) and out.attempts == 2


async def test_400_is_not_retried():
    fake = FakeJudge(default_step={"status": 400})
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv).score("x", CANDIDATE, None, {})
    assert out.reward is None and out.attempts == 1 and fake.calls == 1 and "HTTP 400" in out.error


async def test_bad_answer_is_retried_once():
    fake = FakeJudge(script=[{"raw": "I think it's nice"}])
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv).score("x", CANDIDATE, None, {})
    assert out.reward == pytest.approx(0.8) and out.attempts == 2
    fake = FakeJudge(default_step={"scores": {"geometry": 7}})
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv).score("x", CANDIDATE, None, {})
    assert out.reward is None and out.attempts == 2 and fake.calls == 2
    assert "bad judge answer" in out.error and "outside [0, 1]" in out.error
    assert json.loads(out.raw_answer)["geometry"]["score"] == 7  # kept as evidence


async def test_truncated_answer_is_a_bad_answer():
    fake = FakeJudge(default_step={"finish_reason": "length"})
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv).score("x", CANDIDATE, None, {})
    assert out.reward is None and "max_tokens" in out.error


async def test_key_never_appears_in_error_text():
    fake = FakeJudge(default_step={"status": 401, "echo_auth": True})
    with FakeJudgeServer(fake) as srv:
        out = await judge_for(srv).score("x", CANDIDATE, None, {})
    assert fake.headers[0]["authorization"] == f"Bearer {KEY}"  # the fake did see it, and echoed it
    assert out.reward is None and "HTTP 401" in out.error and KEY not in out.error
    assert KEY not in json.dumps(out.to_evidence())
    assert KEY not in json.dumps(fake.requests)


async def test_concurrency_limit_is_enforced():
    fake = FakeJudge(default_step={"hang": 0.2})
    with FakeJudgeServer(fake) as srv:
        judge = judge_for(srv, concurrency=2)
        outs = await asyncio.gather(*(judge.score("x", CANDIDATE, None, {}) for _ in range(6)))
    assert all(o.reward is not None for o in outs)
    assert fake.calls == 6 and fake.max_in_flight == 2


def test_concurrency_limit_is_shared_across_event_loops():
    """Two threads, each with its own event loop (as run_rollout_sync in workers), share one limit."""
    fake = FakeJudge(default_step={"hang": 0.2})
    results: list = []
    with FakeJudgeServer(fake) as srv:

        def worker():
            judge = judge_for(srv, concurrency=2)

            async def many():
                return await asyncio.gather(*(judge.score("x", CANDIDATE, None, {}) for _ in range(3)))

            results.extend(asyncio.run(many()))

        threads = [threading.Thread(target=worker) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert len(results) == 9 and all(o.reward is not None for o in results)
    assert fake.max_in_flight == 2


async def test_cancelled_waiters_do_not_leak_slots():
    fake = FakeJudge(script=[{"hang": 0.5}])
    with FakeJudgeServer(fake) as srv:
        judge = judge_for(srv, concurrency=1)
        first = asyncio.create_task(judge.score("x", CANDIDATE, None, {}))
        await asyncio.sleep(0.1)
        waiting = asyncio.create_task(judge.score("x", CANDIDATE, None, {}))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert (await first).reward is not None
        out = await asyncio.wait_for(judge.score("x", CANDIDATE, None, {}), 5)
    assert out.reward is not None


@pytest.mark.parametrize("url", ["http://bob:hunter2-pw@h:1/v1", "http://h:1/v1?key=hunter2-pw"])
def test_a_judge_url_with_credentials_is_refused_naming_the_key_variable(url):
    with pytest.raises(JudgeConfigError, match="HARNESS_ENV_JUDGE_API_KEY") as e:
        JudgeConfig.from_env({"HARNESS_ENV_JUDGE_BASE_URL": url, "HARNESS_ENV_JUDGE_MODEL": "vlm"})
    assert "hunter2" not in str(e.value)
