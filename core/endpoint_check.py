"""The policy endpoint, asked directly: before a rollout starts (is anything listening, does it
serve the model's chat completions, what does it give a trainer), and after an agent's model calls
failed as if it were down (does it answer the proxy's own call). The engine (core/engine.py) runs
the first in its `endpoint` phase and the second before an `endpoint` end stands."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from harness_env.core.capture.probe import ProbeResult
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.errors import EndpointError
from harness_env.models import Endpoint

# Nothing listening is refused at once; a timeout only ends a connect that hangs. 5 s was too
# short under a start-up storm (a loaded machine): 12 of 64 Pi rollouts arriving at once failed.
CONNECT_TIMEOUT_S = 30.0
# When the agent's model calls failed as if the endpoint were down, the proxy asks the endpoint
# itself, after these pauses, before calling it the endpoint's failure (reward None): an endpoint
# busy for a moment (the agent's own calls, just aborted, were loading it) answers one of them.
CONFIRM_PAUSES_S = (0.0, 3.0, 6.0)


async def check_endpoint_reachable(base_url: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast (before any harness starts) when nothing listens at the endpoint."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError) as e:
        raise EndpointError(f"policy endpoint {base_url} is unreachable ({type(e).__name__}: {e}); check base_url and that the server is up") from e
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass


def refuse_not_found(probe: ProbeResult, endpoint: Endpoint) -> None:
    """A probe the endpoint answered 404 fails the rollout at once: no chat route there, or no
    such model, and the agent would only fail."""
    if probe.failed_status == 404:
        raise EndpointError(
            f"the policy endpoint answered 404 to a chat completion at {endpoint.base_url}: check base_url "
            f"(usually ending in /v1) and that it serves model {endpoint.model!r}"
        )


async def answers_after_pauses(proxy: CaptureProxy, endpoint: Endpoint) -> bool:
    """Whether the endpoint answers the proxy's own one-token call after one of CONFIRM_PAUSES_S."""
    for pause in CONFIRM_PAUSES_S:
        await asyncio.sleep(pause)
        if await proxy.endpoint_answers(endpoint):
            return True
    return False
