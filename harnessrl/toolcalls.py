"""Hermes-style tool calls: the one rule for what a `<tool_call>` body means.

A body is a tool call when it is a JSON object with a non-empty string `"name"` and arguments
that are a JSON object, given as any of

- `"arguments": {...}`                   (hermes / Qwen / vLLM),
- `"parameters": {...}`                  (Llama-3.1 style; read only when `"arguments"` is absent),
- `"arguments": "{...}"`                 (the OpenAI wire form: a string holding a JSON object).

Anything else (no name, no arguments, arguments that are not an object, a string that does not
parse to an object, a body that is not JSON) is not a call. The proxy keeps such a block in the
content; the compiler counts it as an invalid call attempt. Core module: stdlib only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)  # group 1: the body


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def arguments_json(self) -> str:
        """OpenAI `function.arguments`: a JSON string; non-ASCII kept as written (as vLLM's
        hermes parser does), so it round-trips."""
        return json.dumps(self.arguments, ensure_ascii=False)


def parse_arguments(value: Any) -> dict[str, Any] | None:
    """Arguments as an object: a dict as is, a string holding a JSON object parsed; else None."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    return None


def parse_tool_call(body: str) -> ToolCall | None:
    """The tool call in one `<tool_call>` body (whitespace around the JSON allowed), or None."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = parse_arguments(obj["arguments"] if "arguments" in obj else obj.get("parameters"))
    return ToolCall(name, arguments) if arguments is not None else None


def tool_calls_in(text: str) -> list[ToolCall]:
    """The tool calls of every complete `<tool_call>` block in `text`, in order."""
    return [call for m in BLOCK.finditer(text) if (call := parse_tool_call(m.group(1))) is not None]
