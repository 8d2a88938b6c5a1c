"""A capture session: one rollout's key, policy, and the turns recorded for it.

Turns are held packed while the rollout runs (core/capture/record.py's `CapturedTurn`): a prompt's
ids as text sharing the prompt it extends, completion ids and logprobs in arrays, request messages
sharing the objects of the previous turn's equal ones. `sorted_turns()` makes the wire's Turns,
once, when the result is built.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from harness_env.core.capture import fastjson
from harness_env.core.capture.dialects.sampled import SampledArguments
from harness_env.core.capture.record import CallOutcome, CallRequest, CapturedTurn
from harness_env.core.capture.redact import Redactor, registered_secrets, registry_version
from harness_env.core.capture.retries import Answer, Replays
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.tokens import PromptIds, pack_ids, pack_logps
from harness_env.core.capture.weights import WeightVersions
from harness_env.models import CaptureLevel, Endpoint, Turn, TurnPurpose

if TYPE_CHECKING:
    from harness_env.core.capture.assemble import TurnDraft

CAPTURE_LEVEL_ORDER: dict[CaptureLevel, int] = {"none": 0, "text": 1, "logprobs": 2, "tokens": 3}
MAX_CONSECUTIVE_FAILURES = 3
PROMPTS_TRIED = 8  # earlier prompts a new one is checked against for a shared start (latest first)
MIB = 1024 * 1024
# A result holds every call's whole request (history included), though the record keeps a resent
# history once: the calls' whole requests together may take this many times the recorded budget,
# so the result a rollout serves is bounded too (an honest history grows call by call; one resent
# unchanged, hundreds of times, only inflates the result).
WHOLE_PER_RECORDED = 4
MAX_DROPPED_FIELDS = 64  # names kept in dropped_fields: a request may carry any number of made-up fields
# What a recorded turn holds beyond its texts, per item (about what each takes as JSON).
BYTES_PER_COMPLETION_ID, BYTES_PER_LOGPROB, BYTES_PER_TOP_LOGPROB = 8, 12, 40

__all__ = ["CAPTURE_LEVEL_ORDER", "CapturePolicy", "CaptureSession", "CapturedTurn", "new_session_key"]


def shared_count(earlier: list[Any], new: list[Any]) -> int:
    """How many leading items of `new` equal `earlier`'s."""
    n = 0
    for a, b in zip(earlier, new):
        if a is not b and a != b:
            break
        n += 1
    return n


def share_prefix(earlier: list[Any], new: list[Any], n: int | None = None) -> list[Any]:
    """`new` with its leading items that equal `earlier`'s (`n` of them, if counted already)
    replaced by `earlier`'s objects: a harness resends its whole history every call, and the
    copies are then freed."""
    n = shared_count(earlier, new) if n is None else n
    return earlier[:n] + new[n:] if n else new


def json_bytes(value: Any) -> int:
    try:
        return len(fastjson.dumps(value))
    except (TypeError, ValueError, OverflowError):  # not JSON (cannot come from a request): counted by its text
        return len(str(value))


def answer_bytes(answer: dict[str, Any], error: str | None) -> int:
    """About what a turn's answer (TurnDraft.record_fields) and error add to the record, as JSON."""
    top = sum(len(position) for position in answer.get("top_logprobs", ()))
    return (
        len(answer.get("completion_token_ids", ())) * BYTES_PER_COMPLETION_ID
        + len(answer.get("per_token_logps", ())) * BYTES_PER_LOGPROB
        + top * BYTES_PER_TOP_LOGPROB
        + sum(len(t) + 3 for t in answer.get("completion_tokens", ()))
        + len(answer.get("completion_text", ""))
        + len(answer.get("reasoning_text", ""))
        + len(error or "")
        + (json_bytes(answer["tool_calls"]) if answer.get("tool_calls") else 0)
        + (json_bytes(answer["usage"]) if answer.get("usage") else 0)
    )


def new_session_key() -> str:
    return "hecap-" + secrets.token_urlsafe(24)


@dataclass
class CaptureSession:
    key: str
    endpoint: Endpoint  # holds the real upstream key: lives only in this process
    policy: CapturePolicy
    on_turn: Callable[[CapturedTurn], None] | None = None  # a recorded turn (it reads like a Turn)
    turns: list[CapturedTurn] = field(default_factory=list)  # in completion order
    dropped_fields: set[str] = field(default_factory=set)
    turn_limit_hit: bool = False
    limits_hit: list[str] = field(default_factory=list)  # the rollout budgets the proxy enforced, in words (once each)
    recorded_bytes: int = 0  # what the recorded turns hold (shared prompt starts and history counted once)
    # The engine's tool-call argument texts, to give the engine back its own bytes when the harness
    # replays a call it parsed (Claude Code, Gemini CLI hold objects; Pi writes the text again).
    sampled_arguments: SampledArguments = field(default_factory=SampledArguments)
    consecutive_failures: int = 0
    last_failure_infra: bool = False  # the last failed call was the endpoint's fault (unreachable, timed out, 5xx), not the policy's
    endpoint_down: asyncio.Event = field(default_factory=asyncio.Event)  # set after too many failures in a row
    closed: bool = False
    quiesced: bool = False  # the agent's run is over: its model calls are refused from now on
    continuity: Literal["tokens", "messages"] = "messages"  # "tokens" once the proxy may send continuing calls as token ids (core/capture/continuity.py)
    sync_held_s: float = 0.0  # how long its calls waited for the trainer's weight syncs
    started: float = field(default_factory=time.monotonic)
    _turns_started: int = 0
    _policy_calls_admitted: int = 0
    _auxiliary_calls_admitted: int = 0
    _held_for_calls: dict[int, int] = field(default_factory=dict)  # turn index -> its request's bytes, until recorded
    _whole_bytes: int = 0  # every admitted call's whole request, history included: what the result expands to
    _log_lines: deque[str] = field(default_factory=lambda: deque(maxlen=400))
    _upstream_calls: set[asyncio.Future[Any]] = field(default_factory=set)  # waiting for the upstream's answer
    _relayed_answers: set[Any] = field(default_factory=set)  # upstream responses being streamed to the harness
    _redactor: Redactor | None = None
    _answer_redactor: Redactor | None = None
    _redactor_version: int = -1
    replays: Replays = field(default_factory=Replays)  # answers a retried request is given again
    weights: WeightVersions | None = None  # the proxy's: the policy's weight version

    def next_index(self) -> int:
        """The index of a new turn: turns are numbered in the order their requests arrived."""
        i = self._turns_started
        self._turns_started += 1
        return i

    @property
    def calls_started(self) -> int:
        """Model calls that have arrived (answered or not): the earliest sign the agent is up."""
        return self._turns_started

    def admit_policy_request(self) -> bool:
        """Count a policy call against the turn limit; False once the limit is reached."""
        limit = self.policy.max_turns
        if limit is not None and self._policy_calls_admitted >= limit:
            self.turn_limit_hit = True
            return False
        self._policy_calls_admitted += 1
        return True

    def constrains(self, purpose: str) -> bool:
        """Whether this call's answer must match the rollout's structured_regex: a policy call
        among the first `structured_calls` (admit_policy_request has counted it)."""
        p = self.policy
        if p.structured_regex is None or purpose != "policy":
            return False
        return p.structured_calls is None or self._policy_calls_admitted <= p.structured_calls

    def note_dropped(self, names: set[str]) -> None:
        """Remember request fields the engine was not sent (at most MAX_DROPPED_FIELDS names)."""
        if not names:
            return
        for name in sorted(names - self.dropped_fields):
            if len(self.dropped_fields) >= MAX_DROPPED_FIELDS:
                return
            self.dropped_fields.add(name)

    @property
    def limit_reached(self) -> bool:
        """A limit of the rollout refused a model call (the turn limit or a budget): an end the
        agent brought about, graded as the workspace stands."""
        return self.turn_limit_hit or bool(self.limits_hit)

    def over_budget(self, purpose: str, request_bytes: int) -> tuple[str, str] | None:
        """(code, message) when a model call of `purpose` and size would pass a budget of the
        rollout (auxiliary calls, recorded bytes), else None; the message names the option."""
        policy = self.policy
        if purpose != "policy" and policy.max_auxiliary_calls is not None and self._auxiliary_calls_admitted >= policy.max_auxiliary_calls:
            return self._budget_hit(
                "auxiliary_call_limit",
                f"the limit of {policy.max_auxiliary_calls} model calls without tools (titles, summaries, token counts) for this "
                "rollout is reached; the rollout option max_auxiliary_calls raises it",
            )
        budget = policy.max_recorded_bytes
        held = self.recorded_bytes + sum(self._held_for_calls.values())
        if budget is not None and held + request_bytes > budget:
            return self._budget_hit(
                "recorded_bytes_limit",
                f"this rollout's budget of {budget / MIB:g} MiB of recorded model calls is used up ({held / MIB:.1f} MiB recorded "
                f"or in flight, this request {request_bytes / MIB:.1f} MiB); the rollout option max_recorded_mb raises it",
            )
        if budget is not None and self._whole_bytes + request_bytes > budget * WHOLE_PER_RECORDED:
            return self._budget_hit(
                "recorded_bytes_limit",
                f"this rollout's budget of {budget / MIB:g} MiB of recorded model calls is used up by requests sent whole "
                f"({self._whole_bytes / MIB:.1f} MiB, history included, against {WHOLE_PER_RECORDED}x the budget, what a result "
                "may hold); the rollout option max_recorded_mb raises it",
            )
        return None

    def _budget_hit(self, code: str, message: str) -> tuple[str, str]:
        first = message.split(";")[0].split(" (")[0]
        if not any(hit.startswith(first[:40]) for hit in self.limits_hit):
            self.limits_hit.append(first)
        return code, message

    def hold(self, index: int, purpose: str, request_bytes: int) -> None:
        """Count an admitted call against the budgets: its request's bytes are held for it until
        the turn is recorded (calls in flight cannot pass the budget together)."""
        if purpose != "policy":
            self._auxiliary_calls_admitted += 1
        self._held_for_calls[index] = request_bytes
        self._whole_bytes += request_bytes

    # -- what close() aborts: the session's calls in flight -----------------------------------
    def add_upstream_call(self, call: asyncio.Future[Any]) -> None:
        self._upstream_calls.add(call)

    def discard_upstream_call(self, call: asyncio.Future[Any]) -> None:
        self._upstream_calls.discard(call)

    def add_relayed_answer(self, response: Any) -> None:
        """An upstream response (with a close() method) being streamed to the harness."""
        self._relayed_answers.add(response)

    def discard_relayed_answer(self, response: Any) -> None:
        self._relayed_answers.discard(response)

    def close(self) -> None:
        """The rollout ended: abort the upstream calls and streams still in flight."""
        self.closed = True
        self._abort_in_flight()

    def quiesce(self) -> None:
        """The agent's run is over: refuse every model call from now on and abort those in flight.
        What the agent left running in its sandbox (until the sandbox closes) may still call."""
        self.quiesced = True
        self._abort_in_flight()

    def _abort_in_flight(self) -> None:
        for call in list(self._upstream_calls):
            call.cancel()
        for response in list(self._relayed_answers):
            response.close()

    def upstream_result(self, ok: bool, infra: bool = True) -> None:
        """Count failed calls in a row: a harness that retries the same failing call forever
        (OpenCode does, even on 400 and on our turn-limit 429) must not hold the rollout until its
        timeout. `infra`: the endpoint's fault (unreachable, timeout, 5xx), not the request's."""
        if ok:
            self.consecutive_failures = 0
            return
        self.last_failure_infra = infra
        self.consecutive_failures += 1
        if self.consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
            self.endpoint_down.set()

    @property
    def redactor(self) -> Redactor:
        """Masks the upstream key and every registered secret (core/capture/redact.py); rebuilt
        when the registry changes, so a secret registered after the session opened is masked too."""
        version = registry_version()
        if self._redactor is None or self._redactor_version != version:
            secrets = {self.endpoint.api_key.get_secret_value(), *registered_secrets()}
            self._redactor, self._answer_redactor = Redactor(secrets), Redactor(secrets, partial=False)
            self._redactor_version = version
        return self._redactor

    @property
    def answer_redactor(self) -> Redactor:
        """The same secrets, masked only whole: for the policy's successful answers."""
        self.redactor  # noqa: B018 - (re)builds both
        assert self._answer_redactor is not None
        return self._answer_redactor

    def redact(self, text: str) -> str:
        """Upstream error bodies may echo the key they were given: never record it."""
        return self.redactor.redact(text)

    def log(self, line: str) -> None:
        self._log_lines.append(f"[{time.monotonic() - self.started:8.2f}s] {self.redact(line)}")

    def log_tail(self) -> str:
        return "\n".join(self._log_lines)

    def record(self, request: CallRequest, outcome: CallOutcome, draft: TurnDraft | None = None) -> CapturedTurn:
        """Keep a finished call packed: its answer as `draft` assembled it (None: no answer), its
        prompt's ids as canonical text (core/capture/tokens.py) sharing an earlier prompt's start,
        its history sharing the previous turn's equal messages."""
        answer = draft.record_fields() if draft is not None else {}
        prompt_ids_text = draft.prompt_ids_text() if draft is not None else None
        prompt = None
        held = answer_bytes(answer, outcome.upstream_error)
        if prompt_ids_text:
            earlier = [t.prompt for t in reversed(self.turns[-PROMPTS_TRIED:]) if t.prompt is not None]
            prompt = PromptIds.extending(prompt_ids_text, earlier)
            held += 0 if any(prompt is e for e in earlier) else len(prompt.pieces[-1])  # its new end only
        messages, tools = request.request_messages, request.request_tools
        shared, tools_shared = 0, False
        if self.turns:
            last = self.turns[-1]
            shared = shared_count(last.request_messages, messages)
            messages = share_prefix(last.request_messages, messages, shared)
            if tools == last.request_tools:
                tools, tools_shared = last.request_tools, True
        held += json_bytes(messages[shared:]) + (0 if tools_shared else json_bytes(tools))
        self._held_for_calls.pop(request.index, None)
        self.recorded_bytes += held
        captured = CapturedTurn(
            index=request.index,
            purpose=request.purpose,
            stream=request.stream,
            request_messages=messages,
            request_tools=tools,
            upstream_status=outcome.upstream_status,
            upstream_error=outcome.upstream_error,
            latency_s=outcome.latency_s,
            ttft_s=outcome.ttft_s,
            weight_version=request.weight_version,
            constrained=request.constrained,
            masked=request.constrained and self.policy.mask_constrained,
            prompt=prompt,
            completion=pack_ids(answer.pop("completion_token_ids", [])),
            logps=pack_logps(answer.pop("per_token_logps", [])),
            **answer,
        )
        return self._keep(captured)

    def record_retry(self, answer: Answer, purpose: TurnPurpose, stream: bool, latency_s: float) -> CapturedTurn:
        """Keep a retried request given `answer` again: a turn with no tokens of its own, pointing
        to the turn that holds the request and the answer (core/capture/retries.py)."""
        original = next((t for t in self.turns if t.index == answer.index), None)
        captured = CapturedTurn(
            index=self.next_index(),
            purpose=purpose,
            stream=stream,
            request_messages=[],
            request_tools=[],
            upstream_status=answer.status,
            upstream_error=None,
            latency_s=latency_s,
            ttft_s=None,
            capture_level=original.capture_level if original else "none",
            weight_version=original.weight_version if original else None,
            constrained=original.constrained if original else False,
            masked=original.masked if original else False,
            retry_of=answer.index,
        )
        self.log(f"turn {captured.index}: a retry of turn {answer.index}, given its answer again")
        return self._keep(captured)

    def _keep(self, captured: CapturedTurn) -> CapturedTurn:
        self.turns.append(captured)
        if self.on_turn is not None:
            try:
                self.on_turn(captured)
            except Exception:  # a listener must never break the capture
                pass
        return captured

    def sorted_turns(self) -> list[Turn]:
        """The turns in request order, as the wire's Turns (their token lists made now)."""
        made: dict[int, list[int]] = {}  # each prompt's list extends the one it shares its start with
        return [t.to_turn(made, self._stale(t)) for t in sorted(self.turns, key=lambda t: t.index)]

    def _stale(self, turn: CapturedTurn) -> bool:
        """Whether `turn` was sampled more than the rollout's max_weight_lag versions before the
        policy's version now."""
        bound, now = self.policy.max_weight_lag, self.weights.version if self.weights is not None else None
        return bound is not None and now is not None and turn.weight_version is not None and now - turn.weight_version > bound

    def capture_level(self) -> CaptureLevel:
        """The lowest level reached over the policy turns ("none" if there were none)."""
        levels = [t.capture_level for t in self.turns if t.purpose == "policy" and t.upstream_status == 200]
        if not levels:
            return "none"
        return min(levels, key=lambda lv: CAPTURE_LEVEL_ORDER[lv])
