"""Hermes-style tool calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as Qwen
and vLLM's `hermes` parser use them) turned into OpenAI `tool_calls`. What a block means is
core's rule (harnessrl.toolcalls, shared with the compiler); this module splits content from
calls and decides what of a growing text may be streamed.

`<think>…</think>` is ordinary content here: the text a harness gets back is what it must send
back, so reasoning stays in `content` as the model wrote it.
"""

from __future__ import annotations

import uuid

from harnessrl.toolcalls import BLOCK, TOOL_CALL_OPEN, parse_tool_call


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _as_tool_call(body: str) -> dict | None:
    call = parse_tool_call(body)
    if call is None:
        return None
    return {"id": new_call_id(), "type": "function",
            "function": {"name": call.name, "arguments": call.arguments_json()}}


def parse_hermes(text: str) -> tuple[str | None, list[dict]]:
    """Split model output into (content, tool_calls).

    Every `<tool_call>` block that is a call by harnessrl.toolcalls' rule becomes a tool call
    and leaves the content; a block that does not parse stays in
    the content as text. Whitespace next to a removed block is dropped and the remaining pieces
    are joined by a newline. Without tool calls the content is `text` unchanged. Content is None
    when only whitespace is left.
    """
    pieces: list[str] = []
    calls: list[dict] = []
    start = 0
    for match in BLOCK.finditer(text):
        call = _as_tool_call(match.group(1))
        if call is None:
            continue
        pieces.append(text[start:match.start()])
        calls.append(call)
        start = match.end()
    if not calls:
        return (text if text.strip() else None), []
    pieces.append(text[start:])
    kept = [p.rstrip() if i == 0 else p.lstrip() if i == len(pieces) - 1 else p.strip() for i, p in enumerate(pieces)]
    content = "\n".join(p for p in kept if p)
    return (content or None), calls


def streamable_prefix(text: str) -> int:
    """How much of `text` (generated so far) may be streamed as content now.

    Withholds everything from the first `<tool_call>`, a tail that could be the start of that
    tag, and trailing whitespace (it may precede a tool call and be dropped). For any final text
    that extends `text`, `text[:streamable_prefix(text)]` is a prefix of the content
    `parse_hermes` returns for it (or empty), and the value never shrinks as text grows: stream
    the new part each time, then send `content[len(streamed):]` and the tool calls at the end.
    """
    cut = text.find(TOOL_CALL_OPEN)
    if cut < 0:
        cut = len(text)
        for n in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
            if text.endswith(TOOL_CALL_OPEN[:n]):
                cut = len(text) - n
                break
    return len(text[:cut].rstrip())
