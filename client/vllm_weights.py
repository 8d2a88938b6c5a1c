"""Load a trainer's weights into a running vLLM, on any backend including CPU, through the routes
vLLM itself serves in development mode (`VLLM_SERVER_DEV_MODE=1`): the weights are written as
safetensors to a fresh directory (shared memory where there is one), then vLLM is paused (calls in
flight finish first), reloads them in place, takes the new weight version, drops its prefix cache
and resumes. vLLM's NCCL and CUDA-IPC transports need a GPU; this path needs none.

    sync = VllmWeightSync("http://127.0.0.1:8000")
    seconds = sync.load_weights(model, version=step)   # after each optimiser step

Tell the harness-env servers too (client/weights.py: `syncing=True` before, the version after), so
every captured turn carries the version it was sampled from.

vLLM's CPU backend keeps a packed copy of the output layer made at start-up, which a reload does not
rebuild when the checkpoint ties it to the input embedding (as SmolLM2 does): a trainer that changes
a tied embedding would see vLLM sample from stale output weights. That case is refused: freeze the
embedding (as examples/train_cpu.py does), or train a model whose output layer is its own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

DEV_MODE_HINT = "start vLLM with VLLM_SERVER_DEV_MODE=1 in its environment (its weight routes exist only then)"


class VllmWeightSyncError(RuntimeError):
    """vLLM refused a step of the weight load; the message names the step and what to do."""


def _scratch_root() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def tied_and_trained(model: Any) -> bool:
    """The model ties its output layer to an input embedding that the optimiser changes."""
    config = getattr(model, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return False
    return bool(model.get_input_embeddings().weight.requires_grad)


def checkpoint_tensors(model: Any) -> dict[str, Any]:
    """The model's weights under their Hugging Face names, each its own contiguous CPU tensor
    (safetensors refuses tensors that share memory, as tied weights do)."""
    return {name: tensor.detach().to("cpu").clone().contiguous() for name, tensor in model.state_dict().items()}


def write_checkpoint(tensors: dict[str, Any], directory: Path) -> Path:
    """`directory/model.safetensors`, written under a temporary name first: vLLM never reads half a file."""
    from safetensors.torch import save_file

    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=directory.parent))
    try:
        save_file(tensors, str(tmp / "model.safetensors"))
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


class VllmWeightSync:
    """One vLLM server's weights, kept equal to a trainer's model (see the module's docstring)."""

    def __init__(self, engine_url: str, *, scratch: Path | None = None, pause_mode: str = "wait", timeout_s: float = 600.0) -> None:
        if pause_mode not in ("wait", "abort"):
            # "keep" would resume calls whose cached keys and values came from the old weights
            raise ValueError(f"pause_mode must be 'wait' or 'abort', not {pause_mode!r}")
        self.engine_url = engine_url.rstrip("/").removesuffix("/v1")
        self.pause_mode = pause_mode
        self.timeout_s = timeout_s
        self.scratch = Path(tempfile.mkdtemp(prefix="harness-env-weights-", dir=scratch or _scratch_root()))
        self._loaded: Path | None = None

    def _post(self, client: httpx.Client, path: str, step: str, **kw: Any) -> dict[str, Any]:
        try:
            resp = client.post(self.engine_url + path, **kw)
        except httpx.HTTPError as e:
            raise VllmWeightSyncError(f"{step}: vLLM at {self.engine_url} did not answer ({e})") from e
        if resp.status_code == 404:
            raise VllmWeightSyncError(f"{step}: vLLM at {self.engine_url} has no {path.split('?')[0]}: {DEV_MODE_HINT}")
        if resp.status_code >= 400:
            raise VllmWeightSyncError(f"{step}: vLLM answered {resp.status_code}: {resp.text[:300]}")
        return resp.json() if resp.content else {}

    def load_weights(self, model: Any, version: int | str) -> float:
        """Write the model's weights and load them into vLLM under `version`; the seconds it took."""
        if tied_and_trained(model):
            raise ValueError(
                "the model ties its output layer to an embedding being trained, and vLLM's CPU backend keeps the output "
                "layer it packed at start-up after a reload: freeze the embedding (model.get_input_embeddings()"
                ".requires_grad_(False)) or train a model whose output layer is its own (tie_word_embeddings false)"
            )
        start = time.monotonic()
        target = write_checkpoint(checkpoint_tensors(model), self.scratch / f"v{version}-{time.monotonic_ns()}")
        self.load_directory(target, version)
        return time.monotonic() - start

    def load_directory(self, directory: Path, version: int | str) -> None:
        """Load a directory of safetensors (the model's Hugging Face names) into vLLM under `version`."""
        with httpx.Client(timeout=self.timeout_s) as client:
            self._post(client, f"/pause?mode={self.pause_mode}", "pause")
            try:
                rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(directory)}}
                self._post(client, "/collective_rpc", "reload_weights", json=rpc)
                self._post(client, "/update_weight_version", "update_weight_version", json={"new_version": str(version)})
                self._post(client, "/reset_prefix_cache", "reset_prefix_cache")
            finally:
                self._post(client, "/resume", "resume")  # never left paused, whatever failed
        previous, self._loaded = self._loaded, directory
        if previous is not None and previous.parent == self.scratch:
            shutil.rmtree(previous, ignore_errors=True)  # vLLM now reads the new one

    def version(self) -> str:
        """The weight version vLLM labels its tokens with."""
        with httpx.Client(timeout=30) as client:
            resp = client.get(self.engine_url + "/weight_info")
        if resp.status_code == 404:
            raise VllmWeightSyncError(f"vLLM at {self.engine_url} has no /weight_info: {DEV_MODE_HINT}")
        resp.raise_for_status()
        return str(resp.json()["weight_version"])

    def close(self) -> None:
        """Remove the written checkpoints (vLLM keeps the loaded weights in memory)."""
        shutil.rmtree(self.scratch, ignore_errors=True)
        self._loaded = None

    def __enter__(self) -> VllmWeightSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
