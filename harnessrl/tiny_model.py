"""Build the tiny test model offline and deterministically.

A small Qwen2-architecture causal LM with random (seeded) weights and a byte-level BPE
tokenizer trained in seconds on generated text, with a Qwen/hermes-style chat template
(system/user/assistant/tool messages, tool schemas, `<tool_call>` JSON, `<think>`).
Tests and the demo use it because nothing can be downloaded; any real HF checkpoint
directory works in its place.
"""

from __future__ import annotations

import random
from importlib import resources
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]

_WORDS = (
    "the a an of to and in is it that for on with as by at from this be or are was which "
    "what who where when how why find search look up key value answer question result tool "
    "call function name arguments query city country river capital born year founded author "
    "book company planner worker agent task sub step reasoning think plan first then next "
    "finally return summary file directory list open read write send message price stock buy "
    "sell ticket flight vehicle engine math add multiply number string true false null ok error "
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma"
).split()

_TOOLS = ["lookup", "search", "calculator", "get_weather", "dispatch", "read_file", "send_message"]


def _corpus(seed: int, n: int = 3000) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 14)))
        tool = rng.choice(_TOOLS)
        key = rng.choice(_WORDS)
        num = rng.randint(0, 9999)
        lines.append(f"<|im_start|>user\n{words.capitalize()}?<|im_end|>\n")
        lines.append(
            f'<|im_start|>assistant\n<think>\nI should {words}.\n</think>\n\n<tool_call>\n'
            f'{{"name": "{tool}", "arguments": {{"key": "{key}", "n": {num}}}}}\n</tool_call><|im_end|>\n'
        )
        lines.append(f"<|im_start|>user\n<tool_response>\n{{\"value\": \"{key} {num}\"}}\n</tool_response>\n<|im_end|>\n")
        lines.append(f"<|im_start|>assistant\nThe answer is {key} {num}.<|im_end|>\n")
        lines.append('{"type": "function", "function": {"name": "' + tool + '", "description": "' + words + '", '
                     '"parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}\n')
    return lines


def chat_template() -> str:
    return resources.files("harnessrl").joinpath("chat_template.jinja").read_text()


def build_tokenizer(vocab_size: int = 2048, seed: int = 0):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:],
    )
    fast.chat_template = chat_template()
    return fast


def build_tiny_model(out_dir: str | Path, seed: int = 0, hidden_size: int = 64, layers: int = 2) -> Path:
    """Write tokenizer + randomly initialised Qwen2 model to `out_dir`; returns the path."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(seed=seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
