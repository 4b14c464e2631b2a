"""The answer a search harness reports: the last `<answer>` block, else the text without
reasoning. Scoring itself is harnessrl.answer_match (shared with the compiler's rewards)."""

from __future__ import annotations

import re

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


def extract_answer(text: str | None) -> str:
    """The last `<answer>…</answer>` block, else the text without reasoning blocks."""
    text = text or ""
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1].strip()
    return _THINK.sub("", text).strip()
