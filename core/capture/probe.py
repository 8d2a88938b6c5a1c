"""What an endpoint can give a trainer, found out once per endpoint at first use.

Two one-token calls with the same prompt at two temperatures. Capture level: token ids, logprobs,
or text only. Logprob kind: a trainer needs the *processed* logprobs the sampler drew from
(log_softmax(logits / T); vLLM's `--logprobs-mode processed_logprobs`), not the raw model ones.
At the first position the distribution does not depend on what was sampled, so the gap between
the best and the k-th best top logprob scales by 1/T when logprobs are processed and stays put
when they are raw. A rollout is labelled `train` only with token ids and processed logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness_env.models import CaptureLevel, Turn

PROBE_TEMPERATURES = (1.0, 0.5)
PROBE_TOP_LOGPROBS = 5
PROBE_TIMEOUT_S = 60.0
PROBE_MESSAGES = [{"role": "user", "content": "Name one colour."}]


@dataclass(frozen=True)
class ProbeResult:
    capture_level: CaptureLevel
    processed_logprobs: bool | None  # None: could not tell
    detail: str
    failed_status: int | None = None  # the HTTP status of a probe call that failed

    @property
    def trainable(self) -> bool:
        return self.capture_level == "tokens" and self.processed_logprobs is True


def probe_body(temperature: float) -> dict:
    return {"messages": PROBE_MESSAGES, "max_tokens": 1, "temperature": temperature, "stream": False}


def _gap(turn: Turn) -> float | None:
    if not turn.top_logprobs or len(turn.top_logprobs[0]) < 2:
        return None
    first = sorted((t.logprob for t in turn.top_logprobs[0]), reverse=True)
    return first[0] - first[-1]


def classify(hot: Turn, cold: Turn, hot_t: float = PROBE_TEMPERATURES[0], cold_t: float = PROBE_TEMPERATURES[1]) -> ProbeResult:
    """Read the two probe answers (at temperatures hot_t > cold_t)."""
    for t in (hot, cold):
        if not t.answered:
            return ProbeResult("none", None, f"the probe call failed ({t.upstream_status}): {(t.upstream_error or '')[:200]}", t.upstream_status)
    level = hot.capture_level
    if level == "text":
        return ProbeResult(level, None, "the endpoint returns text only: no token ids, no logprobs")
    g_hot, g_cold = _gap(hot), _gap(cold)
    if g_hot is None or g_cold is None or g_hot <= 1e-6:
        return ProbeResult(level, None, "the endpoint returns no usable top logprobs, so raw and processed logprobs cannot be told apart")
    ratio = g_cold / g_hot
    expected = hot_t / cold_t
    if abs(ratio - expected) <= 0.25 * (expected - 1):
        kind, processed = "processed (post-temperature)", True
    elif abs(ratio - 1) <= 0.25 * (expected - 1):
        kind, processed = "raw (pre-temperature); with vLLM serve with --logprobs-mode processed_logprobs", False
    else:
        kind, processed = f"of unknown kind (top-logprob gap ratio {ratio:.2f}, expected {expected:.2f} or 1)", None
    ids = "token ids and logprobs" if level == "tokens" else "logprobs but no token ids"
    return ProbeResult(level, processed, f"the endpoint returns {ids}; its logprobs are {kind}")
