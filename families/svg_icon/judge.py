"""The vision-language judge of the SVG icon family: any OpenAI-compatible vision model scores a
rendered candidate icon against its source prompt (and the reference image, when there is one) on a
rubric, and the reward is the weighted mean of the rubric's dimension scores, in [0, 1]. What it is
asked and how its answer is read (the rubric, the request, the answer's schema) is judge_format.py;
this module configures the judge and calls it.

Why it looks like this:
- The judge is infrastructure, not the policy: its endpoint is configured separately
  (`HARNESS_ENV_JUDGE_*`), its key lives only in this process (in the Authorization header of the
  request, never in a body, a sandbox, a repr or an error text).
- A judge that cannot answer is an infrastructure failure: `Judge.score` returns `reward=None` with
  `error`, never 0 (a 0 would teach the policy that a good icon is bad). One that answers without
  scores, or refuses what it was shown (400/422), has `bad_answer` set: the picture can cause
  that, so the family grades it 0. It never raises for judge failures; it raises only for
  configuration or programming errors.
- Retries are bounded: at most `max_attempts` calls, exponential backoff with jitter between them,
  on 429/502/503/504, timeouts and connection errors. Other HTTP errors (400, 401, 404, ...) are not
  retried: asking again would get the same answer.
- A bad answer (not JSON, a missing dimension, a score outside [0, 1], a truncated answer) is
  retried once, within the same attempt budget: the judge samples at temperature 0 under a strict
  schema, so a second bad answer means it cannot follow the schema and more calls only cost money.
- One concurrency limit per (base URL, model, limit) is shared by every rollout of the process,
  whichever event loop or thread it runs in (`ProcessLimiter`); a slot is held only while a request is in
  flight, not during backoff.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from harness_env.core.capture.redact import register_secret
from harness_env.core.errors import InvalidRequestError
from harness_env.core.limits import ProcessLimiter
from harness_env.families.svg_icon.judge_format import (
    DEFAULT_RUBRIC,
    DimensionScore,
    JudgeAnswerError,
    JudgeScores,
    Rubric,
    RubricDimension,
    answer_schema,
    bounded,
    build_judge_request,
    parse_judge_answer,
)
from harness_env.models import check_http_url

__all__ = [  # the format's names too: callers import the judge's whole API from here
    "DEFAULT_RUBRIC",
    "DimensionScore",
    "Judge",
    "JudgeAnswerError",
    "JudgeConfig",
    "JudgeConfigError",
    "JudgeOutcome",
    "JudgeScores",
    "Rubric",
    "RubricDimension",
    "answer_schema",
    "build_judge_request",
    "parse_judge_answer",
    "shared_limiter",
]

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
MAX_RAW_ANSWER_CHARS = 20_000  # what is kept as grading evidence
MAX_BAD_ANSWERS = 2  # a bad answer is retried once
# Answers that refuse the request's content rather than the caller (auth, route, rate): the
# rendered picture is the only part of it the agent shapes.
SUBMISSION_REFUSED_STATUS = frozenset({400, 422})

ENV_BASE_URL = "HARNESS_ENV_JUDGE_BASE_URL"
ENV_MODEL = "HARNESS_ENV_JUDGE_MODEL"
ENV_API_KEY = "HARNESS_ENV_JUDGE_API_KEY"
ENV_TIMEOUT = "HARNESS_ENV_JUDGE_TIMEOUT"
ENV_REQUEST_OPTIONS = "HARNESS_ENV_JUDGE_REQUEST_OPTIONS"
ENV_CONCURRENCY = "HARNESS_ENV_JUDGE_CONCURRENCY"


class JudgeConfigError(InvalidRequestError):
    """The judge is misconfigured (an env var is malformed, or the judge is needed but not set)."""


# --------------------------------------------------------------------------------------- config


class JudgeConfig(BaseModel):
    """Where the judge is and how hard to use it. Built from the environment with `from_env`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = ""
    model: str = ""
    api_key: SecretStr = SecretStr("")
    timeout_s: float = Field(default=60.0, gt=0, le=3600, allow_inf_nan=False)
    concurrency: int = Field(default=4, ge=1, le=1024)
    request_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if v:
            check_http_url(v, ENV_BASE_URL, ENV_API_KEY)  # no credentials: the URL is shown in errors and notes
        if v and not re.match(r"^https?://[^\s/]+", v):
            raise ValueError("must be an http(s) URL such as http://127.0.0.1:8000/v1")
        return v

    @property
    def configured(self) -> bool:
        return bool(self.base_url and self.model)

    def require(self) -> JudgeConfig:
        """This config, or a clear error saying which variables to set."""
        missing = [name for name, value in ((ENV_BASE_URL, self.base_url), (ENV_MODEL, self.model)) if not value]
        if missing:
            raise JudgeConfigError(
                f"the SVG icon judge is not configured: set {' and '.join(missing)} (an OpenAI-compatible vision model; {ENV_API_KEY} if it needs a key)"
            )
        return self

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JudgeConfig:
        env = os.environ if env is None else env
        values: dict[str, Any] = {
            "base_url": env.get(ENV_BASE_URL, ""),
            "model": env.get(ENV_MODEL, "").strip(),
            "api_key": SecretStr(env.get(ENV_API_KEY, "").strip()),
        }
        register_secret(values["api_key"])  # masked by the capture proxy wherever it could show up
        if raw := env.get(ENV_TIMEOUT, "").strip():
            try:
                t = float(raw)
            except ValueError:
                t = math.nan
            if not (math.isfinite(t) and 0 < t <= 3600):
                raise JudgeConfigError(f"{ENV_TIMEOUT} must be a number of seconds in (0, 3600], got {raw!r}")
            values["timeout_s"] = t
        if raw := env.get(ENV_CONCURRENCY, "").strip():
            if not re.fullmatch(r"\d+", raw) or not 1 <= int(raw) <= 1024:
                raise JudgeConfigError(f"{ENV_CONCURRENCY} must be an integer in [1, 1024], got {raw!r}")
            values["concurrency"] = int(raw)
        if raw := env.get(ENV_REQUEST_OPTIONS, "").strip():
            try:
                options = json.loads(raw)
            except json.JSONDecodeError as e:
                raise JudgeConfigError(
                    f"{ENV_REQUEST_OPTIONS} is not valid JSON ({e.msg} at position {e.pos}); it must be a JSON object such as '{{\"max_tokens\": 2048}}'"
                ) from None
            if not isinstance(options, dict):
                raise JudgeConfigError(f"{ENV_REQUEST_OPTIONS} must be a JSON object such as '{{\"max_tokens\": 2048}}', got {type(options).__name__}")
            values["request_options"] = options
        try:
            return cls(**values)
        except ValidationError as e:
            names = {"base_url": ENV_BASE_URL, "model": ENV_MODEL}
            problems = "; ".join(f"{names.get(str(err['loc'][0]), err['loc'][0]) if err.get('loc') else 'judge'}: {err['msg']}" for err in e.errors())
            raise JudgeConfigError(f"invalid judge configuration: {problems}") from None


# --------------------------------------------------------------------------------------- answer


def _answer_text(payload: Any) -> str:
    """The assistant text of a chat.completions response, or JudgeAnswerError."""
    try:
        choice = payload["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise JudgeAnswerError("the response has no choices[0].message") from None
    if message.get("refusal"):
        raise JudgeAnswerError(f"the judge refused: {bounded(str(message['refusal']), 300)}")
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str) or not content.strip():
        raise JudgeAnswerError("the answer is empty")
    if choice.get("finish_reason") == "length":
        raise JudgeAnswerError("the answer was cut off (finish_reason=length); raise max_tokens in " + ENV_REQUEST_OPTIONS)
    return content


# --------------------------------------------------------------------------------------- limiter


def shared_limiter(base_url: str, model: str, limit: int) -> ProcessLimiter:
    """The process-wide limiter of one judge (base URL, model, limit)."""
    return ProcessLimiter.named(("judge", base_url, model), limit)


# --------------------------------------------------------------------------------------- judge


@dataclass
class JudgeOutcome:
    """What a judgement produced: `reward` is None when the judge failed (`error` says why)."""

    reward: float | None
    scores: JudgeScores | None
    raw_answer: str | None
    attempts: int
    seconds: float
    error: str | None = None
    attempt_log: list[dict[str, Any]] = field(default_factory=list)  # per call: status or error, seconds
    model: str = ""
    # The judge answered, but never with scores, or refused what it was shown (400/422) on the
    # last call: what the picture shows can cause either (a prompt written into it, a content
    # filter), so it is graded, not an infrastructure failure.
    bad_answer: bool = False

    def to_evidence(self, rubric: Rubric | None = None) -> dict[str, Any]:
        """A JSON-ready record for the grading evidence: raw answer, per-dimension scores, timings."""
        weights = {d.name: d.weight for d in rubric.dimensions} if rubric else {}
        return {
            "judge_model": self.model,
            "reward": self.reward,
            "scores": {
                name: {"score": s.score, "reason": s.reason, **({"weight": weights[name]} if name in weights else {})}
                for name, s in (self.scores.per_dimension.items() if self.scores else [])
            },
            "raw_answer": None if self.raw_answer is None else bounded(self.raw_answer, MAX_RAW_ANSWER_CHARS),
            "attempts": self.attempts,
            "seconds": round(self.seconds, 3),
            "attempt_log": self.attempt_log,
            "error": self.error,
        }


class Judge:
    """Scores rendered icons with a vision model. One per config; safe to share across rollouts."""

    def __init__(
        self,
        config: JudgeConfig,
        *,
        max_attempts: int = 4,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 20.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if max_attempts < 1 or backoff_base_s < 0 or backoff_max_s < 0:
            raise ValueError("max_attempts must be >= 1 and backoff times >= 0")
        self.config = config.require()
        self.max_attempts = max_attempts
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self._transport = transport
        self._url = config.base_url + "/chat/completions"

    def __repr__(self) -> str:
        return f"Judge(base_url={self.config.base_url!r}, model={self.config.model!r}, concurrency={self.config.concurrency})"

    def _scrub(self, text: str) -> str:
        key = self.config.api_key.get_secret_value()
        return text.replace(key, "***") if key else text

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.backoff_max_s))
        return delay

    async def score(
        self, prompt: str, candidate_png: bytes, reference_png: bytes | None = None, evidence: Mapping[str, Any] | None = None, rubric: Rubric = DEFAULT_RUBRIC
    ) -> JudgeOutcome:
        """Judge one candidate. Never raises for a judge failure: reward=None and `error` instead."""
        cfg = self.config
        body = build_judge_request(prompt, candidate_png, reference_png, evidence, rubric, cfg.model, cfg.request_options)
        headers = {"Content-Type": "application/json"}
        if key := cfg.api_key.get_secret_value():
            headers["Authorization"] = f"Bearer {key}"
        limiter = shared_limiter(cfg.base_url, cfg.model, cfg.concurrency)
        start = time.monotonic()
        log: list[dict[str, Any]] = []
        raw: str | None = None
        bad_answers = 0
        error = "the judge was not called"
        attempt = 0

        def outcome(reward: float | None, scores: JudgeScores | None, err: str | None, bad_answer: bool = False) -> JudgeOutcome:
            return JudgeOutcome(reward, scores, raw, attempt, time.monotonic() - start, err, log, cfg.model, bad_answer)

        async with httpx.AsyncClient(timeout=httpx.Timeout(cfg.timeout_s), transport=self._transport) as client:
            while attempt < self.max_attempts:
                attempt += 1
                retry_after: float | None = None
                last_bad = False
                t0 = time.monotonic()
                entry: dict[str, Any] = {"attempt": attempt}
                try:
                    async with limiter:
                        entry["queued_s"] = round(time.monotonic() - t0, 3)
                        t0 = time.monotonic()
                        async with asyncio.timeout(cfg.timeout_s):  # a total deadline, not per read
                            resp = await client.post(self._url, json=body, headers=headers)
                    entry["status"] = resp.status_code
                except (TimeoutError, httpx.TimeoutException):
                    error = f"the judge did not answer within {cfg.timeout_s:g} s"
                    retryable = True
                except httpx.TransportError as e:
                    error = f"cannot reach the judge at {cfg.base_url}: {type(e).__name__}: {e}"
                    retryable = True
                else:
                    if resp.status_code == 200:
                        try:
                            raw = _answer_text(resp.json())
                            scores = parse_judge_answer(raw, rubric)
                        except (JudgeAnswerError, ValueError) as e:
                            bad_answers += 1
                            last_bad = True
                            error = f"bad judge answer: {e}"
                            retryable = bad_answers < MAX_BAD_ANSWERS
                        else:
                            entry["seconds"] = round(time.monotonic() - t0, 3)
                            log.append(entry)
                            return outcome(scores.reward, scores, None)
                    else:
                        error = f"the judge answered HTTP {resp.status_code}: {bounded(resp.text.strip(), 300)}"
                        last_bad = resp.status_code in SUBMISSION_REFUSED_STATUS
                        retryable = resp.status_code in RETRYABLE_STATUS
                        retry_after = _retry_after(resp.headers.get("retry-after"))
                error = self._scrub(error)
                entry["seconds"] = round(time.monotonic() - t0, 3)
                entry["error"] = error
                log.append(entry)
                if not retryable:
                    break
                if attempt < self.max_attempts:
                    await asyncio.sleep(self._backoff(attempt, retry_after))
        return outcome(None, None, error, bad_answer=last_bad)  # how many attempts it took is in `attempts`


def _retry_after(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: use our own backoff
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None
