"""Volatile spans: text a harness rewrites on every call although it tells the model nothing new.

Claude Code, talking to api.anthropic.com (so under interception), puts a per-request hash in the
billing line at the top of its system prompt (`x-anthropic-billing-header: cc_version=…;
cc_entrypoint=…; cch=5ae77;`). A prompt that differs from the earlier call in one character is
no extension of it, so without help every turn of such a session is a new root (and a separate
sample of the whole ~40k-token context). Within a session, a message that differs from the
earlier call's only inside volatile spans is sent to the model as the earlier call had it (the
prefix index, `prefix/index.py`; serving, `Serving._extends`): the prompt is then an exact extension,
training sees exactly what the model saw, and the record keeps the harness's own text with the
spans that were held. The same masking makes agent fingerprints (`identity.unnamed_agent`)
stable across one session's calls. docs/methods.md §2.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from harnessrl.errors import UserError

# The built-in rules (name, regex), from what real harnesses send (captures of Claude Code 2.1.197,
# Codex 0.171, OpenCode 1.18). A span is a whole match, so context goes into the pattern; each
# starts with a literal, which Python's regex engine finds by fast search (a pattern that starts
# with \b or \d is tried at every position: 20-70 times slower on a Claude Code system prompt).
BUILTIN: tuple[tuple[str, str], ...] = (
    # Claude Code's per-request body hash in its billing line (sent when the base URL is
    # api.anthropic.com: every intercepted call)
    ("claude-code-cch", r"cch=[0-9A-Za-z]+;"),
    # the date lines that change when a session crosses midnight: Claude Code's context reminder,
    # OpenCode's <env> block, Codex's <environment_context>
    ("claude-code-date", r"Today's date is \d{4}-\d{2}-\d{2}"),
    ("opencode-date", r"Today's date: [A-Z][a-z]{2} [A-Z][a-z]{2} \d{2} \d{4}"),
    ("codex-date", r"<current_date>[^<\n]*</current_date>"),
)

# what a span is replaced with to compare or fingerprint text: a private-use character, so a
# literal in the text cannot pass for a span
_MARK = "\ue000"


def check_pattern(pattern: str) -> None:
    """A `--volatile-pattern` must compile and must not match the empty string (it would mark
    every position of every prompt)."""
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise UserError(f"--volatile-pattern {pattern!r} is not a regular expression: {exc}") from None
    if rx.search("") is not None:
        raise UserError(f"--volatile-pattern {pattern!r} matches the empty string: give one that matches text")


class Volatile:
    """The built-in rules plus the proxy's `--volatile-pattern`s, each its own regex (one
    alternation of them all loses the engine's literal search: ~10x slower)."""

    def __init__(self, extra: Sequence[str] = ()) -> None:
        for p in extra:
            check_pattern(p)
        self.patterns: tuple[str, ...] = (*(p for _, p in BUILTIN), *extra)
        self._rxs = [re.compile(p) for p in self.patterns]

    def mask(self, text: str) -> str:
        """`text` with every volatile span replaced by one mark: equal masks are texts that differ
        only inside volatile spans."""
        for rx in self._rxs:
            text = rx.sub(_MARK, text)
        return text

    def held(self, sent: str, harness: str) -> list[list[str]]:
        """The spans of two texts equal under `mask` that differ: [value sent to the model (the
        earlier call's), value the harness sent], rule by rule."""
        return [[a.group(), b.group()] for rx in self._rxs for a, b in zip(rx.finditer(sent), rx.finditer(harness))
                if a.group() != b.group()]

    def fingerprint(self, text: str) -> str:
        """4 hex digits of the masked text: the same for every call of one session."""
        return hashlib.sha256(self.mask(text).encode("utf-8", "surrogatepass")).hexdigest()[:4]
