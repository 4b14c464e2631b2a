"""Ids for calls recorded without them (docs/methods.md §1): re-rendered with the model's chat template.

A re-rendered call is flagged `retokenized`: its ids may differ from what the model sampled, and
it has no behaviour log-probs. Cost: two template renders and two encodes per call.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def retokenize(tokenizer: Any, endpoint: str, request: dict[str, Any], text: str,
               tool_calls: list[Any] | None) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and completion ids of one call from its request and response text."""
    def enc(s: str) -> np.ndarray:
        return np.asarray(tokenizer.encode(s, add_special_tokens=False), dtype=np.int32)

    if endpoint != "chat":
        return enc(request.get("prompt") or ""), enc(text)
    messages, tools = request.get("messages") or [], request.get("tools")
    prompt_text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    reply = {"role": "assistant", "content": text}
    if tool_calls:
        reply["tool_calls"] = tool_calls
    full_text = tokenizer.apply_chat_template(messages + [reply], tools=tools, tokenize=False)
    prompt = enc(prompt_text)
    if full_text.startswith(prompt_text):
        completion = enc(full_text[len(prompt_text):])
        eos = np.flatnonzero(completion == tokenizer.eos_token_id)
        if len(eos):  # the template's newline after EOS is not generated
            completion = completion[: eos[-1] + 1]
        return prompt, completion
    return prompt, np.concatenate([enc(text), np.asarray([tokenizer.eos_token_id], dtype=np.int32)])
