"""Responses input items → chat messages. A run of assistant items (reasoning, message, function
and custom tool calls) is one assistant message — reasoning joined back into the content as the
model wrote it (`surfaces.blocks.join_think`) — and a call's output a tool message. A namespaced
call is the name the model was shown (`surfaces.responses.tools.visible`), a custom tool call a function
call whose one argument `input` is the item's input.

`additional_tools` items hold tool declarations (`surfaces.responses.tools`), not messages; a client tool
search's `tool_search_call` / `tool_search_output` are a call of the function `tool_search` and
its tool message, the tools it loaded rendered there (`surfaces.responses.tools.loaded_text`);
`configuration_update` items change a hosted model's reasoning effort: recorded, not applied, as
the body's `reasoning` is. Item ids and statuses are not needed to render a prompt and are not
read. Any other item type (a hosted tool's call, an `item_reference`) is a 400 naming it.
"""

from __future__ import annotations

import json
from typing import Any

from harnessrl.proxy.surfaces.responses.tools import _bad, loaded_text, visible
from harnessrl.proxy.surfaces.blocks import join_think

_ROLES = ("user", "system", "developer", "assistant")


def input_messages(items: Any, path: str, context: list | None = None) -> list[dict]:
    """Chat messages for `input` (a string, or a list of items); the tools its items declare are
    appended to `context` as [path, tool, shown]: `additional_tools` shown, `tool_search_output`
    loaded."""
    context = context if context is not None else []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise _bad("must be a string or a list of items", path)
    out: list[dict] = []
    turn: dict | None = None  # the assistant message being assembled from consecutive items

    def flush() -> None:
        nonlocal turn
        if turn is not None:
            out.append(_assistant(turn))
            turn = None

    for i, it in enumerate(items):
        p = f"{path}[{i}]"
        if not isinstance(it, dict):
            raise _bad("must be an object", p)
        kind = it.get("type", "message")
        if kind == "message" and it.get("role") == "assistant":
            if turn is None or turn["calls"]:
                flush()
                turn = {"reasoning": None, "text": [], "calls": []}
            turn["text"].append(_text_content(it.get("content"), f"{p}.content"))
        elif kind == "message":
            if it.get("role") not in _ROLES:
                raise _bad(f"role must be one of {list(_ROLES)}", f"{p}.role")
            flush()
            out.append({"role": it["role"], "content": _user_content(it.get("content"), f"{p}.content")})
        elif kind == "reasoning":
            if turn is not None:
                flush()
            turn = {"reasoning": _reasoning_text(it, p), "text": [], "calls": []}
        elif kind in ("function_call", "custom_tool_call"):
            value = "arguments" if kind == "function_call" else "input"
            for name in ("call_id", "name", value):
                if not isinstance(it.get(name), str):
                    raise _bad("must be a string", f"{p}.{name}")
            if it.get("namespace") is not None and not isinstance(it["namespace"], str):
                raise _bad("must be a string", f"{p}.namespace")
            if turn is None:
                turn = {"reasoning": None, "text": [], "calls": []}
            # a custom tool's input is the one string argument of the function the model is shown
            arguments = it[value] if kind == "function_call" else json.dumps({"input": it[value]},
                                                                             ensure_ascii=False)
            turn["calls"].append({"id": it["call_id"], "type": "function", "function": {
                "name": visible(it.get("namespace"), it["name"]), "arguments": arguments}})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if not isinstance(it.get("call_id"), str):
                raise _bad("must be a string", f"{p}.call_id")
            flush()
            out.append({"role": "tool", "tool_call_id": it["call_id"],
                        "content": _text_content(it.get("output"), f"{p}.output")})
        elif kind == "additional_tools":
            if not isinstance(it.get("tools"), list):
                raise _bad("must be a list of tools", f"{p}.tools")
            context += [[f"{p}.tools[{j}]", t, True] for j, t in enumerate(it["tools"])]
        elif kind == "tool_search_call":
            if not isinstance(it.get("call_id"), str):
                raise _bad("must be a string", f"{p}.call_id")
            if not isinstance(it.get("arguments"), dict):
                raise _bad("must be an object", f"{p}.arguments")
            if turn is None:
                turn = {"reasoning": None, "text": [], "calls": []}
            turn["calls"].append({"id": it["call_id"], "type": "function", "function": {
                "name": "tool_search", "arguments": json.dumps(it["arguments"], ensure_ascii=False)}})
        elif kind == "tool_search_output":
            if not isinstance(it.get("call_id"), str):
                raise _bad("must be a string", f"{p}.call_id")
            if not isinstance(it.get("tools"), list):
                raise _bad("must be a list of tools", f"{p}.tools")
            flush()
            out.append({"role": "tool", "tool_call_id": it["call_id"], "content": loaded_text(it["tools"],
                                                                                             f"{p}.tools")})
            context += [[f"{p}.tools[{j}]", t, False] for j, t in enumerate(it["tools"])]
        elif kind == "configuration_update":
            pass  # a reasoning-effort change, like the body's `reasoning`: recorded, not applied
        else:
            raise _bad(f"items of type {kind!r} are not supported (this proxy serves message, reasoning, "
                       "function_call, custom_tool_call, tool_search_call, their outputs, additional_tools and "
                       "configuration_update items)", f"{p}.type", "unsupported_item")
    flush()
    return out


def _assistant(turn: dict) -> dict:
    text = "".join(turn["text"])
    content = join_think(turn["reasoning"], text)
    msg: dict[str, Any] = {"role": "assistant", "content": content if content or not turn["calls"] else None}
    if turn["calls"]:
        msg["tool_calls"] = turn["calls"]
    return msg


def _parts(content: Any, path: str) -> list[dict]:
    if not isinstance(content, list):
        raise _bad("must be a string or a list of content parts", path)
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise _bad("must be an object", f"{path}[{j}]")
    return content


def _text_content(content: Any, path: str) -> str:
    """Text parts (input_text, output_text, refusal) joined; anything else is refused here."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(_parts(content, path)):
        key = "refusal" if part.get("type") == "refusal" else "text"
        if part.get("type") not in ("input_text", "output_text", "text", "refusal") or not isinstance(
                part.get(key), str):
            raise _bad(f"must be a text part (got type {part.get('type')!r})", f"{path}[{j}]", "unsupported_content")
        texts.append(part[key])
    return "".join(texts)


def _user_content(content: Any, path: str) -> str | list[dict]:
    if isinstance(content, str):
        return content
    parts = _parts(content, path)
    if all(p.get("type") != "input_image" for p in parts):
        return _text_content(parts, path)
    out: list[dict] = []
    for j, part in enumerate(parts):
        if part.get("type") == "input_image":
            if not isinstance(part.get("image_url"), str):
                raise _bad("an image must be given as image_url (file ids are not served here)",
                           f"{path}[{j}].image_url", "unsupported_content")
            out.append({"type": "image_url", "image_url": {"url": part["image_url"],
                                                           "detail": part.get("detail") or "auto"}})
        else:
            out.append({"type": "text", "text": _text_content([part], f"{path}[{j}]")})
    return out


def _reasoning_text(item: dict, path: str) -> str:
    content = item.get("content") or []
    key = "content" if content else "summary"
    parts = item.get(key) or []
    if not isinstance(parts, list) or not all(isinstance(x, dict) and isinstance(x.get("text"), str) for x in parts):
        raise _bad("must be a list of text parts", f"{path}.{key}")
    return "".join(x["text"] for x in parts)
