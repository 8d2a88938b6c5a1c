"""A model call's record while the rollout runs, and the wire's Turn made from it once.

The proxy records a call in two steps: when it is admitted, what the harness asked (`CallRequest`);
when it ends, what the upstream gave (`CallOutcome`, and the turn draft the answer was assembled
into). The session keeps both as one `CapturedTurn`, its token lists packed (core/capture/tokens.py);
`to_turn` makes the models.Turn when the result is built, and nothing changes a record after.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from harness_env.core.capture.tokens import PromptIds
from harness_env.models import CaptureLevel, TopLogprob, Turn, TurnPurpose


@dataclass(slots=True)
class CallRequest:
    """What an admitted model call asked, as recorded (secrets masked)."""

    index: int  # in the order the requests arrived
    purpose: TurnPurpose
    stream: bool
    request_messages: list[dict[str, Any]]
    request_tools: list[dict[str, Any]]
    weight_version: int | None = None  # the policy's, when the call was sent (core/capture/weights.py)
    constrained: bool = False  # sent with the rollout's structured_regex


@dataclass(slots=True)
class CallOutcome:
    """How a model call ended, besides its answer's content."""

    upstream_status: int | None
    upstream_error: str | None  # masked
    latency_s: float
    ttft_s: float | None = None


@dataclass(frozen=True, slots=True)
class CapturedTurn:
    """A recorded call as the session holds it: its token lists packed (a prompt's ids as text
    sharing the prompt it extends, completion ids and logprobs in arrays), its request history
    sharing the previous call's equal messages. Reads like a Turn (the lists are made when read)."""

    index: int
    purpose: TurnPurpose
    stream: bool
    request_messages: list[dict[str, Any]]
    request_tools: list[dict[str, Any]]
    upstream_status: int | None
    upstream_error: str | None
    latency_s: float
    ttft_s: float | None
    prompt: PromptIds | None = None
    completion: array | list[int] = field(default_factory=list)
    logps: array = field(default_factory=lambda: array("d"))
    completion_tokens: list[str] = field(default_factory=list)
    top_logprobs: list[list[TopLogprob]] = field(default_factory=list)
    completion_text: str = ""
    reasoning_text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    capture_level: CaptureLevel = "none"
    weight_version: int | None = None
    constrained: bool = False
    masked: bool = False  # left out of the loss (the policy's mask_constrained)
    retry_of: int | None = None  # a retry answered with this turn's answer (core/capture/retries.py): no tokens of its own

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.prompt.ids() if self.prompt is not None else []

    @property
    def completion_token_ids(self) -> list[int]:
        return list(self.completion)

    @property
    def per_token_logps(self) -> list[float]:
        return self.logps.tolist()

    def to_turn(self, made: dict[int, list[int]] | None = None, stale: bool = False) -> Turn:
        """The wire's Turn, built once from the record (`made`: prompt lists made already,
        PromptIds.ids). Its values are the record's, checked when recorded: not validated again
        (a rollout's turns hold every token id it sampled)."""
        return Turn.model_construct(
            index=self.index,
            purpose=self.purpose,
            stream=self.stream,
            request_messages=self.request_messages,
            request_tools=self.request_tools,
            prompt_token_ids=self.prompt.ids(made) if self.prompt is not None else [],
            completion_token_ids=self.completion_token_ids,
            per_token_logps=self.per_token_logps,
            completion_tokens=self.completion_tokens,
            top_logprobs=self.top_logprobs,
            completion_text=self.completion_text,
            reasoning_text=self.reasoning_text,
            tool_calls=self.tool_calls,
            finish_reason=self.finish_reason,
            latency_s=self.latency_s,
            ttft_s=self.ttft_s,
            usage=self.usage,
            upstream_status=self.upstream_status,
            upstream_error=self.upstream_error,
            capture_level=self.capture_level,
            weight_version=self.weight_version,
            constrained=self.constrained,
            masked=self.masked,
            stale=stale,
            parent=self.retry_of,
            branch=None,
            link="retry" if self.retry_of is not None else None,
        )
