"""The Anthropic Messages API, request side: a `POST /v1/messages` (or `/count_tokens`) body,
checked with errors that name its own fields the way Anthropic does (`messages.1.content.0.type`),
translated to the internal chat body. Every field is translated by one of these rules or refused
with a 400 naming it — none is dropped unseen:

- `system` becomes the first system message; a `system` role message inside `messages` (Claude
  Code's mid-conversation system messages, beta `mid-conversation-system-*`) a system message in
  the same place (the chat template renders it there: the tiny model's as a system turn);
- an assistant turn's `thinking`, `text` and `tool_use` blocks one assistant message (thinking
  joined back into the content as the model wrote it, `surfaces.blocks.join_think`; a thinking
  block's `signature` is not checked);
- a user turn's `tool_result` blocks tool messages (an `is_error` result's text starts with
  "Error: ", the one way chat can say so; a `tool_reference` in a result is the referenced tool's
  definition, `surfaces.anthropic.tools`; an image in a result, which a chat tool message cannot hold,
  opens the user message that follows the turn's tool messages), its text and image blocks the
  user message;
- tools, `tool_choice`: `surfaces.anthropic.tools` (client tools, deferred tools, hosted tools);
- `stop_sequences` → `stop`; `output_config.format` (a JSON schema) → `response_format`; `top_k`
  is passed on (vLLM honours it);
- recorded with the call and otherwise ignored: `metadata`, `thinking` (the model thinks as its
  template lets it), `output_config.effort`, `context_management` (the prompt is the conversation
  the harness sent: nothing is cleared from it), `service_tier`, `container`, and `cache_control`
  wherever it appears (a prompt-caching hint: the proxy's prefix reuse needs none).
"""

from __future__ import annotations

import json
from typing import Any

from harnessrl.proxy.surfaces.anthropic.tools import _bad, tool_choice, tool_reference, tools
from harnessrl.proxy.protocol import Request
from harnessrl.proxy.surfaces.blocks import join_think
from harnessrl.proxy.surfaces.hosted_tools import Removed
from harnessrl.proxy.validate import check_chat, is_int, is_num

RECORDED_HEADERS = ("anthropic-version", "anthropic-beta")
_TRANSLATED = {"model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences",
               "stream", "tools", "tool_choice", "output_config"}
_IGNORED = {"metadata", "thinking", "context_management", "service_tier", "container", "cache_control"}
_OUTPUT_CONFIG = {"format", "effort"}


_CHECKS = (
    ("model", lambda v: isinstance(v, str), "must be a string"),
    ("max_tokens", lambda v: is_int(v) and v >= 1, "must be a positive integer"),
    ("stream", lambda v: isinstance(v, bool), "must be a boolean"),
    ("temperature", lambda v: is_num(v) and 0 <= v <= 1, "must be a number in [0, 1]"),
    ("top_p", lambda v: is_num(v) and 0 < v <= 1, "must be a number in (0, 1]"),
    ("top_k", lambda v: is_int(v) and v >= 0, "must be a non-negative integer"),
    ("stop_sequences", lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v),
     "must be a list of strings"),
    ("metadata", lambda v: isinstance(v, dict), "must be an object"),
    ("tools", lambda v: isinstance(v, list), "must be a list"),
)


def to_request(body: dict, strict_tools: bool = False) -> Request:
    """The chat `Request` for a Messages body; hosted tools removed (recorded in its notes) or,
    with `strict_tools`, refused."""
    if body.get("max_tokens") is None:
        raise _bad("max_tokens", "field required")
    removed = Removed(strict_tools)
    return Request(translate(body, removed), surface={"api": "anthropic", "body": body}, notes=removed.notes())


def translate(body: dict, removed: Removed | None = None) -> dict:
    """The chat body for a Messages body (count_tokens bodies too: no max_tokens needed)."""
    removed = removed if removed is not None else Removed()
    for name in body:
        if name not in _TRANSLATED and name not in _IGNORED and name != "mcp_servers":
            raise _bad(name, "is not supported by this proxy")
    for name, ok, what in _CHECKS:
        if body.get(name) is not None and not ok(body[name]):
            raise _bad(name, what)
    if not isinstance(body.get("model"), str):
        raise _bad("model", "field required")
    if body.get("mcp_servers"):
        raise _bad("mcp_servers", "MCP servers are not supported by this proxy (connect them in the harness)")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages", "must be a non-empty list of messages")
    declared = tools(body.get("tools") or [], removed)
    messages: list[dict] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text(body["system"], "system")})
    for i, m in enumerate(msgs):
        p = f"messages.{i}"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise _bad(p, "must be an object with role 'user', 'assistant' or 'system'")
        if m["role"] == "system":
            messages.append({"role": "system", "content": _text(m.get("content"), f"{p}.content")})
        else:
            messages += (_assistant(m.get("content"), p) if m["role"] == "assistant"
                         else _user(m.get("content"), p, declared.functions))
    if not any(m.get("role") == "user" for m in msgs):
        raise _bad("messages", "must hold a user message")
    if msgs[-1].get("role") == "assistant":
        raise _bad(f"messages.{len(msgs) - 1}", "a final assistant message (prefill) is not supported by this proxy")
    chat: dict[str, Any] = {"model": body["model"], "messages": messages, "stream": bool(body.get("stream"))}
    for src, dst in (("max_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("top_k", "top_k"), ("stop_sequences", "stop")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    if declared.shown:
        chat["tools"] = declared.shown
    if body.get("tool_choice") is not None:
        chat.update(tool_choice(body["tool_choice"], declared.shown))
    config = body.get("output_config")
    if config is not None and not isinstance(config, dict):
        raise _bad("output_config", "must be an object")
    for key in config or {}:
        if key not in _OUTPUT_CONFIG:
            raise _bad(f"output_config.{key}", "is not supported by this proxy")
    fmt = (config or {}).get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise _bad("output_config.format", "must be {'type': 'json_schema', 'schema': {...}}")
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    check_chat(chat)
    return chat


def _blocks(content: Any, path: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _bad(path, "must be a string or a list of content blocks")
    for j, b in enumerate(content):
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise _bad(f"{path}.{j}", "must be a content block with a type")
    return content


def _text(content: Any, path: str, known: dict[str, dict] | None = None, images: list | None = None) -> str:
    """Text blocks joined (system prompts; tool results, where `known` tools may be referenced and
    images are moved to `images`)."""
    out = []
    for j, b in enumerate(_blocks(content, path)):
        if b["type"] == "tool_reference" and known is not None:
            out.append(tool_reference(b, f"{path}.{j}", known))
        elif b["type"] == "image" and images is not None:
            url = _image_url(b.get("source"), f"{path}.{j}.source")
            images.append({"type": "image_url", "image_url": {"url": url}})
        elif b["type"] != "text" or not isinstance(b.get("text"), str):
            raise _bad(f"{path}.{j}.type", f"only text blocks are supported here, got {b['type']!r}")
        else:
            out.append(b["text"])
    return "\n".join(out)


def _assistant(content: Any, path: str) -> list[dict]:
    thinking: list[str] = []
    texts: list[str] = []
    calls: list[dict] = []
    for j, b in enumerate(_blocks(content, f"{path}.content")):
        p = f"{path}.content.{j}"
        if b["type"] == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        elif b["type"] == "thinking" and isinstance(b.get("thinking"), str):
            thinking.append(b["thinking"])
        elif b["type"] == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str) or not isinstance(
                    b.get("input"), dict):
                raise _bad(p, "a tool_use block needs a string id and name and an object input")
            calls.append({"id": b["id"], "type": "function", "function": {
                "name": b["name"], "arguments": json.dumps(b["input"], ensure_ascii=False)}})
        else:
            raise _bad(f"{p}.type", f"{b['type']!r} blocks are not supported in assistant messages here "
                                    "(text, thinking and tool_use are)")
    content_text = join_think("".join(thinking) if thinking else None, "".join(texts))
    msg: dict[str, Any] = {"role": "assistant", "content": content_text if content_text or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    return [msg]


def _user(content: Any, path: str, known: dict[str, dict]) -> list[dict]:
    out: list[dict] = []
    parts: list[dict] = []
    media: list[dict] = []  # tool results' images: a chat tool message holds text only

    def flush() -> None:
        if parts:
            text_only = all(p["type"] == "text" for p in parts)
            out.append({"role": "user", "content": "".join(p["text"] for p in parts) if text_only else list(parts)})
            parts.clear()

    for j, b in enumerate(_blocks(content, f"{path}.content")):
        p = f"{path}.content.{j}"
        if b["type"] == "tool_result":
            if not isinstance(b.get("tool_use_id"), str):
                raise _bad(f"{p}.tool_use_id", "field required")
            flush()
            text = _text(b.get("content") or "", f"{p}.content", known, media)
            out.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                        "content": "Error: " + text if b.get("is_error") else text})
        elif b["type"] == "text" and isinstance(b.get("text"), str):
            parts.append({"type": "text", "text": b["text"]})
        elif b["type"] == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(b.get("source"), f"{p}.source")}})
        else:
            raise _bad(f"{p}.type", f"{b['type']!r} blocks are not supported in user messages here "
                                    "(text, image and tool_result are)")
    parts[:0] = media  # after the tool messages, before the turn's own parts
    flush()
    return out


def _image_url(source: Any, path: str) -> str:
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type') or 'image/png'};base64,{source['data']}"
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise _bad(path, "an image source must be base64 data or a url")
