"""Prefix-consistent prompts.

A chat template re-renders an earlier assistant turn from its text, and the tokens it gives
are often not the tokens the model sampled (token drift): multi-turn sessions then cannot be
merged into one sample, and training would see a context the model never saw. When a call's
messages extend an earlier call of the same rollout/agent/session (its messages + the
assistant message the proxy returned), the prompt is built as that call's exact
prompt+completion ids followed by the rendered new messages.

The suffix: render the earlier conversation (no generation prompt) as text P and the new one
(with it) as F. If F starts with P, the new part is F[len(P):], preceded by whatever the
template puts after the end-of-turn token (P's text after its last EOS string, e.g. "\\n").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harnessrl.messages import content_text
from harnessrl.proxy.prefix.index import Turn


def for_template(messages: list[dict]) -> list[dict]:
    """Content parts joined to text, None content as "" (what chat templates expect)."""
    out = []
    for m in messages:
        c = m.get("content")
        if c is None or isinstance(c, list):
            m = {**m, "content": content_text(c) or ""}
        out.append(m)
    return out


@dataclass(slots=True)
class Plan:
    ids: list[int]
    path: str  # "prefix" | "render"
    prefix_call_id: str | None
    drift: bool | None


class Prompter:
    """Builds token prompts for chat calls from a HF tokenizer with a chat template."""

    def __init__(self, tokenizer: Any, prefix_mode: bool,
                 render_ids: Callable[[list[dict], list | None], list[int]] | None = None) -> None:
        self.tok = tokenizer
        self.prefix_mode = prefix_mode
        self.eos_id: int = tokenizer.eos_token_id
        self.eos_text: str = tokenizer.eos_token
        self._render_ids = render_ids

    def render_text(self, messages: list[dict], tools: list | None, generation: bool) -> str:
        return self.tok.apply_chat_template(for_template(messages), tools=tools or None, tokenize=False,
                                            add_generation_prompt=generation)

    def render(self, messages: list[dict], tools: list | None) -> list[int]:
        if self._render_ids is not None:
            return list(self._render_ids(for_template(messages), tools or None))
        return self.encode(self.render_text(messages, tools, True))

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def plan(self, messages: list[dict], tools: list | None, turn: Turn | None) -> Plan:
        rendered = self.render(messages, tools)
        if turn is None:
            return Plan(rendered, "render", None, None)
        drift = not turn.starts(rendered)
        if self.prefix_mode:
            ids = self.extend(messages, tools, turn)
            if ids is not None:
                return Plan(ids, "prefix", turn.call_id, drift)
        return Plan(rendered, "render", turn.call_id, drift)

    def extend(self, messages: list[dict], tools: list | None, turn: Turn) -> list[int] | None:
        """turn's exact ids + the rendered new messages, or None when the template does not
        render the conversation as an extension of the earlier one."""
        k = turn.n_messages + 1
        p = self.render_text(messages[:k], tools, False)
        f = self.render_text(messages, tools, True)
        cut = p.rfind(self.eos_text)
        if not f.startswith(p) or cut < 0:
            return None
        # a turn cut short (length, stop string) gets the end-of-turn token the template adds
        close = [] if turn.ends_turn else [self.eos_id]
        return turn.exact.tolist() + close + self.encode(p[cut + len(self.eos_text):] + f[len(p):])
