"""The white-box harness's own options (WhiteboxHarness.options_model), declared once: the CLI's
flags, the MCP schema's and the web form's controls are derived from these fields."""

from __future__ import annotations

from typing import ClassVar

from harness_env.models.options import HarnessOptions, option

__all__ = ["DEFAULT_MAX_TOKENS", "WhiteboxOptions"]

# A call with no cap generates until the context is full: on a real vLLM (max_model_len 8192) one
# call sampled 7,135 tokens, a 526 s rollout. A tool-loop step rarely needs more than this.
DEFAULT_MAX_TOKENS = 2048


class WhiteboxOptions(HarnessOptions):
    """The white-box loop calls the policy itself: these say how."""

    label: ClassVar[str] = "white-box"

    max_tokens: int = option(
        DEFAULT_MAX_TOKENS,
        "max_tokens of each white-box model call (the rollout's max_tokens_cap, if lower, still caps it)",
        group="harness",
        title="max tokens per call",
        ge=1,
        le=1_000_000,
    )
