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

from array import array
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from harnessrl.messages import content_text


@dataclass(slots=True)
class Turn:
    """A recorded call that later calls may extend."""

    call_id: str
    messages: list[dict]
    tools: list | None
    reply: dict  # the assistant message the proxy returned
    exact: array  # prompt + completion ids, int32 (4 bytes a token, not a Python int each)
    ends_turn: bool  # the completion ended with EOS

    @classmethod
    def of(cls, call_id: str, messages: list[dict], tools: list | None, reply: dict, prompt_ids: list[int],
           completion_ids: list[int], eos_ids: frozenset[int] | set[int]) -> Turn:
        exact = array("i", prompt_ids)
        exact.extend(completion_ids)
        return cls(call_id, messages, tools, reply, exact, bool(completion_ids) and completion_ids[-1] in eos_ids)

    def starts(self, ids: list[int]) -> bool:
        """Whether `ids` begins with this call's exact prompt + completion ids."""
        n = len(self.exact)
        return len(ids) >= n and array("i", ids[:n]) == self.exact


def _text(content: Any) -> str | None:
    return content_text(content) or None


def _args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


def _norm(m: dict) -> tuple:
    calls = tuple(
        (tc.get("function", tc).get("name"), orjson.dumps(_args(tc.get("function", tc).get("arguments")),
                                                         option=orjson.OPT_SORT_KEYS))
        for tc in (m.get("tool_calls") or []) if isinstance(tc, dict)
    )
    return (m.get("role"), _text(m.get("content")), calls, m.get("tool_call_id"), m.get("name"))


def same_message(a: dict, b: dict) -> bool:
    """Equal as the model sees them: None/"" content alike, tool-call arguments as JSON values,
    tool-call ids and extra SDK fields ignored."""
    return a == b or _norm(a) == _norm(b)


def for_template(messages: list[dict]) -> list[dict]:
    """Content parts joined to text, None content as "" (what chat templates expect)."""
    out = []
    for m in messages:
        c = m.get("content")
        if c is None or isinstance(c, list):
            m = {**m, "content": _text(c) or ""}
        out.append(m)
    return out


class PrefixIndex:
    """Recent calls per (rollout, agent, session), in memory: no DB query on the hot path."""

    def __init__(self, per_key: int = 8, max_keys: int = 4096) -> None:
        self._turns: OrderedDict[tuple, deque[Turn]] = OrderedDict()
        self._per_key = per_key
        self._max_keys = max_keys

    def add(self, key: tuple, turn: Turn) -> None:
        turns = self._turns.get(key)
        if turns is None:
            turns = self._turns[key] = deque(maxlen=self._per_key)
            if len(self._turns) > self._max_keys:
                self._turns.popitem(last=False)
        else:
            self._turns.move_to_end(key)
        turns.append(turn)

    def forget(self, rollout_id: str) -> None:
        """Drop a finished rollout's calls."""
        for key in [k for k in self._turns if k[0] == rollout_id]:
            del self._turns[key]

    def find(self, key: tuple, messages: list[dict], tools: list | None) -> Turn | None:
        """The latest call whose messages + reply are the longest prefix of `messages`."""
        best: Turn | None = None
        for t in reversed(self._turns.get(key, ())):
            k = len(t.messages)
            if len(messages) <= k or (best is not None and k <= len(best.messages)) or t.tools != tools:
                continue
            if not same_message(messages[k], t.reply):
                continue
            head = messages[:k]
            if head == t.messages or all(same_message(a, b) for a, b in zip(head, t.messages)):
                best = t
        return best


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
        k = len(turn.messages) + 1
        p = self.render_text(messages[:k], tools, False)
        f = self.render_text(messages, tools, True)
        cut = p.rfind(self.eos_text)
        if not f.startswith(p) or cut < 0:
            return None
        # a turn cut short (length, stop string) gets the end-of-turn token the template adds
        close = [] if turn.ends_turn else [self.eos_id]
        return turn.exact.tolist() + close + self.encode(p[cut + len(self.eos_text):] + f[len(p):])
