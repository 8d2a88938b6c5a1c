"""What an endpoint can give a trainer, found out once per endpoint at first use.

Two one-token calls with the same prompt at two temperatures. Capture level: token ids, logprobs,
or text only. Logprob kind: a trainer needs the *processed* logprobs the sampler drew from
(log_softmax(logits / T); vLLM's `--logprobs-mode processed_logprobs`), not the raw model ones.
At the first position the distribution does not depend on what was sampled, so the gap between
the best and the k-th best top logprob scales by 1/T when logprobs are processed and stays put
when they are raw. A rollout is labelled `train` only with token ids and processed logprobs.

Whether the endpoint can continue threads in token ids (vLLM's render route answers:
`probe_continuity`) is asked the same way, once per endpoint.

The probe's request is also how the proxy learns which fields it adds an endpoint rejects
(`probe_rejected_fields`): no agent shaped it, so a 400 to it is about the endpoint, never about
text an agent put in a request (which a validation error may quote).
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp

from harness_env.core.capture import fastjson
from harness_env.core.capture.rewrite import CapturePolicy, EndpointQuirks, learn_from_rejection, rewrite_request
from harness_env.models import CaptureLevel, Endpoint, Turn

PROBE_TEMPERATURES = (1.0, 0.5)
PROBE_TOP_LOGPROBS = 5
PROBE_TIMEOUT_S = 60.0
PROBE_MESSAGES = [{"role": "user", "content": "Name one colour."}]
RENDER = "/chat/completions/render"  # vLLM's chat render (--enable-scale-out): token continuity, core/capture/continuity.py
MAX_FIELD_PROBES = 5  # one request per field it may drop (ADDED_FIELDS, the max_tokens rename), and the accepted one


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


def _gap(turn: Turn, k: int) -> float | None:
    """Best minus (k-1)-th best at the first position. vLLM lists the *sampled* token first: when
    it is not among the k best it takes the k-th entry's place, so the list is the sampled token
    and the k-1 best. Only ranks 1..k-1 are there in every case, and the sampled entry is read only
    where it ranks (it is dropped when it is the lowest: there it may stand outside the ranking)."""
    if not turn.top_logprobs or not turn.per_token_logps:
        return None
    ranked = sorted((t.logprob for t in turn.top_logprobs[0]), reverse=True)
    if ranked and ranked[-1] == turn.per_token_logps[0]:
        ranked.pop()
    ranked = ranked[: k - 1]
    if len(ranked) < 2:
        return None
    return ranked[0] - ranked[-1]


def classify(hot: Turn, cold: Turn, hot_t: float = PROBE_TEMPERATURES[0], cold_t: float = PROBE_TEMPERATURES[1], k: int = PROBE_TOP_LOGPROBS) -> ProbeResult:
    """Read the two probe answers (at temperatures hot_t > cold_t, each asked for k top logprobs)."""
    for t in (hot, cold):
        if not t.answered:
            return ProbeResult("none", None, f"the probe call failed ({t.upstream_status}): {(t.upstream_error or '')[:200]}", t.upstream_status)
    level = hot.capture_level
    if level == "text":
        return ProbeResult(level, None, "the endpoint returns text only: no token ids, no logprobs")
    g_hot, g_cold = _gap(hot, k), _gap(cold, k)
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


async def probe_rejected_fields(
    http: aiohttp.ClientSession, endpoint: Endpoint, headers: dict[str, str], policy: CapturePolicy, quirks: EndpointQuirks
) -> bool | None:
    """Send the probe's one-token request with the fields `policy` adds, learning into `quirks`
    each field the endpoint rejects (core/capture/rewrite.py), until it is accepted. True:
    something was learned; False: nothing to learn; None: no clear answer (not to be remembered)."""
    probe_policy = CapturePolicy(capture=policy.capture, top_logprobs=policy.top_logprobs, disable_thinking=policy.disable_thinking)
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
    learned = False
    for _attempt in range(MAX_FIELD_PROBES):
        body, added, _ = rewrite_request(probe_body(PROBE_TEMPERATURES[0]), probe_policy, quirks, endpoint.model)
        try:
            async with http.post(endpoint.base_url + "/chat/completions", data=fastjson.dumps(body), headers=headers, timeout=timeout) as resp:
                status, content = resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            return None
        if status < 400:
            return learned
        if learn_from_rejection(status, content, added, quirks) is None:
            return learned if status < 500 else None  # refused for another reason: nothing more to learn from it
        learned = True
    return learned


async def probe_continuity(http: aiohttp.ClientSession, endpoint: Endpoint, headers: dict[str, str]) -> int | None:
    """The engine's context length when it renders chat requests (the render route answers with
    token ids, and its model list says max_model_len), else None. Raises on no clear answer."""
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
    body = fastjson.dumps({"model": endpoint.model, "messages": PROBE_MESSAGES})
    async with http.post(endpoint.base_url + RENDER, data=body, headers=headers, timeout=timeout) as resp:
        if resp.status >= 500:
            raise aiohttp.ClientError(f"render answered {resp.status}")
        rendered = fastjson.loads(await resp.read()) if resp.status == 200 else None
    if not isinstance(rendered, dict) or not rendered.get("token_ids"):
        return None
    async with http.get(endpoint.base_url + "/models", headers=headers, timeout=timeout) as resp:
        models = fastjson.loads(await resp.read()) if resp.status == 200 else {}
    lengths = [m.get("max_model_len") for m in (models or {}).get("data") or () if m.get("id") == endpoint.model]
    return lengths[0] if lengths and isinstance(lengths[0], int) else None
