"""The probe against the real engine: vLLM started with processed logprobs is labelled `train`,
and with raw logprobs `eval`, every time (the sampled token vLLM adds to `top_logprobs` changes
call to call; it once decided the label at random)."""

import pytest

from harness_env.core.capture.proxy import CaptureProxy
from harness_env.models import Endpoint
from tests.vllm_engine import VllmServer

TRIES = 20


@pytest.fixture(scope="module")
def raw_vllm_server():
    with VllmServer(logprobs_mode="raw_logprobs") as srv:
        yield srv


async def _labels(server) -> list[bool | None]:
    endpoint = Endpoint(base_url=server.base_url, api_key="", model=server.model)
    seen = []
    for _ in range(TRIES):
        proxy = CaptureProxy()  # a new one each time: a proxy probes an endpoint once
        try:
            result = await proxy.probe(endpoint)
        finally:
            await proxy.aclose()
        assert result.capture_level == "tokens", result.detail
        seen.append(result.processed_logprobs)
    return seen


async def test_a_processed_logprobs_vllm_is_labelled_train_every_time(vllm_server):
    assert await _labels(vllm_server) == [True] * TRIES


async def test_a_raw_logprobs_vllm_is_labelled_eval_every_time(raw_vllm_server):
    assert await _labels(raw_vllm_server) == [False] * TRIES
