"""The parsed response of one completion: its tool calls and its final answer.

Tool calls come from the recorded native `tool_calls` and from the text: hermes `<tool_call>`
JSON (by `harnessrl.toolcalls`, the rule the proxy uses too) and MATPO `<use_mcp_tool>` XML. A
block that is not a valid call is kept as an attempt with no name and no arguments (it counts
against `tool_format` and MATPO's rates). Beside native calls a `<tool_call>` block counts only when it is
not a valid call: the proxy's own parser moves valid blocks into `tool_calls` and leaves broken
ones in the content, and vLLM's keeps everything as content when one block is broken, so both
record shapes of one turn count the same attempts; a valid block some server left in the content
beside its tool call is that call, not a second one. The answer is the text of `<answer>` /
`\\boxed{}`, else the content outside think and call blocks.

The regexes work on bytes and stop at NUL: the labeller runs them over a batch of completions
joined by NUL bytes, and no span may cross one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from harnessrl.toolcalls import parse_arguments, parse_tool_call


@dataclass
class ParsedCall:
    name: str | None
    arguments: dict[str, Any] | None  # None when the arguments do not parse as a JSON object
    raw: str = ""


@dataclass
class ParsedResponse:
    calls: list[ParsedCall] = field(default_factory=list)
    answer: str | None = None  # text of <answer>/\boxed{}, else the content outside think/calls
    has_answer_marker: bool = False


# `[^\x00]` and `(?=\x00)`: a batch joins completions with NUL bytes, and no span crosses one
TOOL_CALL = re.compile(rb"<tool_call>([^\x00]*?)(?:</tool_call>|(?=\x00)|\Z)")
MCP = re.compile(rb"<use_mcp_tool>([^\x00]*?)(?:</use_mcp_tool>|(?=\x00)|\Z)")
MCP_FIELD = re.compile(rb"<(server_name|tool_name|arguments)>([^\x00]*?)(?:</\1>|(?=\x00)|\Z)")
ANSWER = re.compile(rb"(<answer>)([^\x00]*?)(</answer>|(?=\x00)|\Z)")
BOXED = re.compile(rb"\\boxed\{")
THINK_CLOSE = re.compile(rb"</think>")
THINK = re.compile(rb"(<think>)([^\x00]*?)(</think>|(?=\x00)|\Z)")


def native_call(tc: dict[str, Any]) -> ParsedCall:
    """A recorded OpenAI tool call (`function.arguments` a JSON string or an object)."""
    f = tc.get("function", tc)
    args = f.get("arguments")
    name = f.get("name")
    return ParsedCall(name if isinstance(name, str) and name else None, parse_arguments(args),
                      args if isinstance(args, str) else json.dumps(args))


def boxed_span(text: bytes, start: int) -> tuple[int, int] | None:
    """(content start, closing brace) of a \\boxed{ at `start`, braces balanced."""
    i = start + len(b"\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == 0:
            return None
        if text[j] == 0x7B:
            depth += 1
        elif text[j] == 0x7D:
            depth -= 1
            if depth == 0:
                return i, j
    return None


def parse_response(text: str, native_calls: list[dict[str, Any]] | None = None) -> ParsedResponse:
    """Tool calls (native, else hermes / MATPO text) and the final answer of one completion."""
    raw = text.encode()
    out = ParsedResponse()
    out.calls = [native_call(tc) for tc in native_calls or []]
    for m in TOOL_CALL.finditer(raw):
        body = m.group(1).decode(errors="replace").strip()
        call = parse_tool_call(body)
        if call is None:
            out.calls.append(ParsedCall(None, None, body))
        elif not native_calls:
            out.calls.append(ParsedCall(call.name, call.arguments, body))
    if not native_calls:
        for m in MCP.finditer(raw):
            fields = {k.decode(): v.decode(errors="replace").strip() for k, v in MCP_FIELD.findall(m.group(1))}
            out.calls.append(ParsedCall(fields.get("tool_name"), parse_arguments(fields.get("arguments", "")),
                                        m.group(1).decode(errors="replace")))
    m = ANSWER.search(raw)
    if m:
        out.answer, out.has_answer_marker = m.group(2).decode(errors="replace").strip(), True
        return out
    b = BOXED.search(raw)
    span = boxed_span(raw, b.start()) if b else None
    if span:
        out.answer, out.has_answer_marker = raw[span[0]:span[1]].decode(errors="replace").strip(), True
        return out
    close = THINK_CLOSE.search(raw)
    rest = raw[close.end():] if close else raw
    rest = TOOL_CALL.sub(b"", MCP.sub(b"", rest))
    rest = re.sub(rb"<\|[^|>]*\|>", b"", rest)  # template specials such as EOS
    out.answer = rest.decode(errors="replace").strip() or None
    return out
