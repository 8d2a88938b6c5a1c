"""The CPU stand-in for vLLM: SmolLM2-135M-Instruct answering chat completions as vLLM does."""

from tests.cpu_policy.chat_model import (
    CHAT_TEMPLATE,
    MODEL_NAME,
    Answer,
    ChatCompletionsApp,
    ChatModel,
    PolicyServer,
    converted_model_dir,
    load_smollm2,
    parse_tool_calls,
    teacher_forced_logprobs,
)

__all__ = [
    "CHAT_TEMPLATE",
    "MODEL_NAME",
    "Answer",
    "ChatCompletionsApp",
    "ChatModel",
    "PolicyServer",
    "converted_model_dir",
    "load_smollm2",
    "parse_tool_calls",
    "teacher_forced_logprobs",
]
