"""Expert traces for PACT (docs/methods.md §6.4): turns, a rule segmenter for reasoning, prefix levels.

`structure_trace(messages)` turns an expert's OpenAI-style chat messages into

    {"turns": [{"reasoning": str,
                "reasoning_segments": [{"text": str, "explicit_call_preview": bool}, ...],
                "tool_call": {"name": str, "arguments": {...}} | null,   # the turn's first call
                "tool_calls": [{"name", "arguments"}, ...],
                "observation": str | null,                               # tool results, joined
                "levels": [L0, L1, L2, L3, L4]}],                        # revealed reasoning text
     "final_answer": str | null}

The final assistant message without a tool call is the final answer and is not a turn.
Segments are paragraphs; a paragraph that previews the exact call (a JSON object, "the tool
call would be …", `name(`, or the name with every argument value) is `explicit_call_preview`
and is never revealed. Level ℓ reveals the first ⌈ℓ·n/4⌉ of the n segments before the first
preview (L0 nothing, L4 the longest safe prefix) **[R]**.
"""

from __future__ import annotations

import json
import re
from typing import Any

from harnessrl.compiler.response import parse_response
from harnessrl.messages import content_text
from harnessrl.pact_levels import all_levels

_PARAGRAPHS = re.compile(r"\n\s*\n")
_JSON_OBJECT = re.compile(r"\{\s*\"[^\"]+\"\s*:")
_PREVIEW_PHRASE = re.compile(r"(tool call|function call|the call)\s+(would|will|should|is going to)\s+be|<tool_call>", re.I)
_THINK = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.S)
_TOOL_CALL = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.S)
_TOOL_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.S)


def is_call_preview(text: str, call: dict[str, Any] | None) -> bool:
    if _JSON_OBJECT.search(text) or _PREVIEW_PHRASE.search(text):
        return True
    if not call or not call.get("name"):
        return False
    name = call["name"]
    if re.search(re.escape(name) + r"\s*\(", text):
        return True
    values = [v if isinstance(v, str) else json.dumps(v) for v in (call.get("arguments") or {}).values()]
    return bool(values) and name in text and all(v in text for v in values)


def segment(reasoning: str, call: dict[str, Any] | None) -> list[dict[str, Any]]:
    parts = [p.strip() for p in _PARAGRAPHS.split(reasoning) if p.strip()]
    return [{"text": p, "explicit_call_preview": is_call_preview(p, call)} for p in parts]


def _split_assistant(message: dict[str, Any]) -> tuple[str, list[dict[str, Any]], str]:
    """(reasoning, calls, answer text) of one assistant message."""
    content = content_text(message.get("content"))
    parsed = parse_response(content, message.get("tool_calls"))
    calls = [{"name": c.name, "arguments": c.arguments or {}} for c in parsed.calls if c.name]
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    think = _THINK.search(content)
    if not reasoning and think:
        reasoning = think.group(1)
    outside = _TOOL_CALL.sub("", _THINK.sub("", content)).strip()
    if calls and outside:  # free text before the call is reasoning too
        reasoning = "\n\n".join(x for x in (reasoning.strip(), outside) if x)
    return reasoning.strip(), calls, (parsed.answer if parsed.has_answer_marker else outside)


def structure_trace(messages: list[dict[str, Any]]) -> dict[str, Any]:
    turns: list[dict[str, Any]] = []
    final_answer: str | None = None
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant":
            reasoning, calls, answer = _split_assistant(m)
            is_last_assistant = all(x.get("role") != "assistant" for x in messages[i + 1:])
            if not calls and is_last_assistant:
                final_answer = answer or None
                continue
            call = calls[0] if calls else None
            segs = segment(reasoning, call)
            turns.append({"reasoning": reasoning, "reasoning_segments": segs, "tool_call": call,
                          "tool_calls": calls, "observation": None, "levels": all_levels(segs)})
        elif turns and role in ("tool", "user"):
            text = content_text(m.get("content"))
            obs = [text] if role == "tool" else _TOOL_RESPONSE.findall(text)
            if obs:
                prev = turns[-1]["observation"]
                turns[-1]["observation"] = "\n".join(([prev] if prev else []) + [o.strip() for o in obs])
    return {"turns": turns, "final_answer": final_answer}
