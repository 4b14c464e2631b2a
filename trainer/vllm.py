"""`harnessrl vllm`: start `vllm serve` from its own environment with the flags the proxy and the
weight push need. vLLM pins its own torch/transformers, so it is never imported here; its
environment is `.venv-vllm` (scripts/install_vllm.sh: the CUDA build with a GPU, the CPU build
without), found in the working directory or beside this checkout."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from harnessrl.errors import UserError

PROJECT_BIN = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "vllm"  # an editable checkout's
DEFAULT_BINS = (".venv-vllm/bin/vllm", str(PROJECT_BIN), "~/.venvs/vllm/bin/vllm", "/opt/vllm/bin/vllm")
# GiB of KV cache on the CPU build: its default share of RAM does not fit beside a trainer on a
# small machine, and the tiny model's contexts need far less. The CUDA build ignores it.
CPU_KVCACHE_GIB = "1"


def find_vllm(explicit: str | None = None) -> str:
    for candidate in (explicit, os.environ.get("HARNESSRL_VLLM_BIN"), *DEFAULT_BINS, shutil.which("vllm")):
        if candidate and Path(candidate).expanduser().is_file():
            return str(Path(candidate).expanduser().absolute())
    raise UserError("no vLLM found: run scripts/install_vllm.sh (makes .venv-vllm), or pass --vllm-bin PATH "
                    "(or set HARNESSRL_VLLM_BIN)")


def serve_command(vllm_bin: str, model: str, host: str = "127.0.0.1", port: int = 8001, lora: bool = False,
                  max_lora_rank: int = 64, served_name: str | None = None, extra: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The argv and extra environment for `vllm serve`."""
    cmd = [
        vllm_bin, "serve", model, "--host", host, "--port", str(port),
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--logprobs-mode", "processed_logprobs",  # log-probs after temperature/top-p: what was sampled from
        "--enable-prefix-caching",
    ]
    if served_name:
        cmd += ["--served-model-name", served_name]
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)}
    if lora:
        cmd += ["--enable-lora", "--max-lora-rank", str(max_lora_rank)]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # /v1/load_lora_adapter
    else:
        env["VLLM_SERVER_DEV_MODE"] = "1"  # /collective_rpc (reload_weights) and /reset_prefix_cache
    return cmd + list(extra or []), env


def untie_embeddings(model_dir: str | Path) -> bool:
    """Give a checkpoint with tied input/output embeddings its own `lm_head.weight` (a copy: the
    model computes the same), so that vLLM's in-place reload updates the output layer too: vLLM
    0.32's `reload_weights` leaves a tied output layer at the weights it started with
    (docs/vllm.md). Returns whether it changed anything."""
    import json

    from safetensors.torch import load_file, save_file

    path = Path(model_dir)
    config = json.loads((path / "config.json").read_text())
    if not config.get("tie_word_embeddings"):
        return False
    files = sorted(path.glob("*.safetensors"))
    if len(files) != 1:
        raise UserError(f"{path}: untying needs one model.safetensors file, found {len(files)}")
    tensors = load_file(str(files[0]))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(files[0]), metadata={"format": "pt"})
    config["tie_word_embeddings"] = False
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return True


def tied(model_dir: str | Path) -> bool:
    import json

    try:
        return bool(json.loads((Path(model_dir) / "config.json").read_text()).get("tie_word_embeddings"))
    except (OSError, ValueError):
        return False


def check_tools_rendered(model: str, extra: list[str]) -> None:
    """Refuse a model directory whose chat template renders no tools: vLLM would serve every
    request's tools as a prompt without them (its own `--chat-template`, in `extra`, is the user's)."""
    path = Path(model)
    if any(a == "--chat-template" or a.startswith("--chat-template=") for a in extra) \
            or not (path / "tokenizer_config.json").is_file():
        return
    from transformers import AutoTokenizer

    from harnessrl.tool_rendering import dropped_tools_message, template_renders_tools

    if not template_renders_tools(AutoTokenizer.from_pretrained(path)):
        raise UserError(dropped_tools_message(str(path)) + ", or pass --chat-template FILE through to vllm serve")


def run_vllm(cmd: list[str], env: dict[str, str]) -> None:
    """Replace this process with vLLM (signals and exit status go straight to it)."""
    os.execvpe(cmd[0], cmd, {**os.environ, **env})
