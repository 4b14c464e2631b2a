"""Rewritten replies: a harness that sends the model's earlier turn back in a form of its own.

smolagents 1.26 keeps its own memory and re-sends each earlier turn as text: the assistant
message the proxy returned (content and `tool_calls`) comes back as one assistant text,
`"<think>…</think>\\nCalling tools:\\n[{'id': …, 'function': {'name': …, 'arguments': {…}}}]"`
without `tool_calls`, and CodeAgent's with the `</code>` it stopped on appended and its code
listed as a `python_interpreter` call. The recorded completion never appears in the next prompt,
so without help every call is a root of its own.

A rule is data: a regular expression over such a message's text (the whole text must match)
whose named groups give the turn back — `text`, what the model wrote as content; optionally
`calls`, its tool calls as a JSON or Python-literal list of `{"function": {"name", "arguments"}}`
(or `{"name", "arguments"}`); optionally `appended`, text the harness may add after the model's
own (compared with and without it). The message is the recorded reply when what the groups give
back equals the reply's text and tool calls as the prefix index compares messages
(`index.same_message`: reasoning in or beside the content, arguments as JSON values, ids
ignored). No groups give a tool call the reply lacks, so a rule never passes one turn off as
another. In prefix mode the model is then sent the recorded turn (its exact ids); docs/methods.md §2.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import Any

import orjson

from harnessrl.errors import UserError
from harnessrl.messages import content_text
from harnessrl.proxy.prefix.index import same_message

# (name, regex): what real harnesses send, captured from smolagents 1.26 (ToolCallingAgent and
# CodeAgent, `ActionStep.to_messages` merged by `get_clean_message_list`). The CodeAgent rule
# comes first: its listed call is the harness's own reading of the code, not a tool call of the model.
BUILTIN: tuple[tuple[str, str], ...] = (
    ("smolagents-code",
     r"(?s)(?P<text>.*?)(?P<appended></code>)?\nCalling tools:\n\[\{'id': 'call_\d+', 'type': 'function', "
     r"'function': \{'name': 'python_interpreter', 'arguments': .*\}\}\]"),
    ("smolagents-tool-calls", r"(?s)(?P<text>.*?)\n?Calling tools:\n(?P<calls>\[.*\])"),
)


def check_pattern(pattern: str) -> None:
    """A `--rewrite-pattern` must compile and have a `text` group."""
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise UserError(f"--rewrite-pattern {pattern!r} is not a regular expression: {exc}") from None
    if "text" not in rx.groupindex:
        raise UserError(f"--rewrite-pattern {pattern!r} has no (?P<text>...) group: name the model's text in it")


def _literal(s: str) -> Any:
    try:
        return orjson.loads(s)
    except orjson.JSONDecodeError:
        pass
    try:  # a Python repr (smolagents: str() of a list of dicts); literals only, never code
        return ast.literal_eval(s)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _calls(s: str | None) -> list[dict] | None:
    """The groups' tool calls as a message's `tool_calls`, or None if they are not a list of calls."""
    if s is None:
        return []
    value = _literal(s)
    if not isinstance(value, list):
        return None
    out = []
    for c in value:
        f = c.get("function", c) if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            return None
        out.append({"function": {"name": f["name"], "arguments": f.get("arguments")}})
    return out


_Reading = tuple[str, tuple[str, ...], list[dict]]  # rule, the texts it reads (with/without `appended`), calls
_CACHED_CHARS = 16 * 1024  # texts cached up to this long, at most _CACHED of them: ≤ ~16M characters held
_CACHED = 1024


class Rewrites:
    """The built-in rules plus the proxy's `--rewrite-pattern`s (named `pattern-1`, …).

    A harness that rewrites re-sends every earlier turn on every call, so each turn's text is read
    again and again (a rule's regex and a literal parse: ~0.1 ms): what a text reads as is cached."""

    def __init__(self, extra: Sequence[str] = ()) -> None:
        for p in extra:
            check_pattern(p)
        named = (*BUILTIN, *((f"pattern-{i}", p) for i, p in enumerate(extra, 1)))
        self.rules = tuple((name, re.compile(p)) for name, p in named)
        self._read: dict[str, list[_Reading]] = {}

    def rule_of(self, harness: dict, reply: dict) -> str | None:
        """The rule by which the harness's assistant message `harness` is the proxy's `reply`, or None."""
        if harness.get("role") != "assistant" or harness.get("tool_calls") or reply.get("role") != "assistant":
            return None
        text = content_text(harness.get("content"))
        for name, texts, calls in self.readings(text) if text else ():
            if any(same_message({"role": "assistant", "content": t, "tool_calls": calls}, reply) for t in texts):
                return name
        return None

    def readings(self, text: str) -> list[_Reading]:
        """What the rules read out of an assistant message's text, rule by rule."""
        got = self._read.get(text)
        if got is not None:
            return got
        got = []
        for name, rx in self.rules:
            m = rx.fullmatch(text)
            calls = _calls(m.groupdict().get("calls")) if m is not None else None
            if m is None or calls is None:
                continue
            added = m.groupdict().get("appended")
            got.append((name, (m["text"], m["text"] + added) if added else (m["text"],), calls))
        if len(text) <= _CACHED_CHARS:
            if len(self._read) >= _CACHED:
                del self._read[next(iter(self._read))]  # the oldest
            self._read[text] = got
        return got
