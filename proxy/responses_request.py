"""The OpenAI Responses API, request side: a `POST /v1/responses` body, checked with errors that
name its own fields (`input[2].content[0].type`), translated to the internal chat body.

Input items become chat messages: a run of assistant items (reasoning, message, function calls)
is one assistant message — reasoning joined back into the content as the model wrote it
(`surface_blocks.join_think`) — and `function_call_output` a tool message. With
`previous_response_id` the earlier call is read from the records (`resolve`): its messages, its
answer, then the new input, so the prompt extends the earlier one token-exactly (the prefix index
finds that call as for chat). Fields that only tune a hosted service (`truncation`, `reasoning`,
`metadata`, `prompt_cache_key`, …) are recorded with the call and otherwise ignored.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from harnessrl.proxy.errors import ProxyError, bad_request
from harnessrl.proxy.protocol import Request
from harnessrl.proxy.surface_blocks import join_think
from harnessrl.proxy.validate import check_chat, is_int, is_num

RESPONSE_PREFIX = "resp_"
LOGPROBS_INCLUDE = "message.output_text.logprobs"
_ROLES = ("user", "system", "developer", "assistant")
# set to anything but these, a field asks for a service this proxy does not run
_UNSUPPORTED = {"background": (None, False), "conversation": (None,), "prompt": (None,)}


def _bad(message: str, param: str, code: str = "invalid_type") -> ProxyError:
    return bad_request(f"{param}: {message}", param=param, code=code)



_CHECKS = (
    ("model", lambda v: isinstance(v, str), "must be a string"),
    ("instructions", lambda v: isinstance(v, str), "must be a string"),
    ("stream", lambda v: isinstance(v, bool), "must be a boolean"),
    ("store", lambda v: isinstance(v, bool), "must be a boolean"),
    ("parallel_tool_calls", lambda v: isinstance(v, bool), "must be a boolean"),
    ("max_output_tokens", lambda v: is_int(v) and v >= 1, "must be a positive integer"),
    ("temperature", lambda v: is_num(v) and 0 <= v <= 2, "must be a number in [0, 2]"),
    ("top_p", lambda v: is_num(v) and 0 < v <= 1, "must be a number in (0, 1]"),
    ("top_logprobs", lambda v: is_int(v) and 0 <= v <= 20, "must be an integer in [0, 20]"),
    ("previous_response_id", lambda v: isinstance(v, str), "must be a string"),
    ("include", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "must be a list of strings"),
    ("metadata", lambda v: isinstance(v, dict), "must be an object"),
    ("text", lambda v: isinstance(v, dict), "must be an object"),
    ("tools", lambda v: isinstance(v, list), "must be a list"),
)


def to_request(body: dict) -> Request:
    """The chat `Request` for a Responses body (400 naming the field when it is malformed)."""
    for name, ok, what in _CHECKS:
        if body.get(name) is not None and not ok(body[name]):
            raise _bad(what, name)
    for name, allowed in _UNSUPPORTED.items():
        if body.get(name) not in allowed:
            raise _bad("is not supported by this proxy (it records calls it serves now; keep the conversation "
                       "in the input or use previous_response_id)", name, "unsupported_parameter")
    if "input" not in body:
        raise _bad("is required", "input", "missing_required_parameter")
    messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    messages += input_messages(body["input"], "input")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "stream": bool(body.get("stream"))}
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("parallel_tool_calls", "parallel_tool_calls")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = _response_format((body.get("text") or {}).get("format"))
    if fmt is not None:
        chat["response_format"] = fmt
    if LOGPROBS_INCLUDE in (body.get("include") or ()):
        chat["logprobs"] = True
        if body.get("top_logprobs") is not None:
            chat["top_logprobs"] = body["top_logprobs"]
    if body.get("previous_response_id") is None:
        check_chat(chat)
    return Request(chat, surface={"api": "responses", "body": body})


async def resolve(req: Request, fetch: Callable[[str], Awaitable[dict | None]]) -> Request:
    """With `previous_response_id`: the earlier conversation + its answer + the new input."""
    prev_id = (req.surface or {}).get("body", {}).get("previous_response_id")
    if prev_id is None:
        return req
    prev = await fetch(prev_id[len(RESPONSE_PREFIX):]) if prev_id.startswith(RESPONSE_PREFIX) else None
    if prev is None or prev["api"] != "responses" or not prev["store"] or not prev["ok"]:
        raise ProxyError(400, f"previous response with id {prev_id!r} not found", param="previous_response_id",
                         code="previous_response_not_found")
    earlier = [*prev["messages"], prev["reply"]]
    new = req.body["messages"]
    if new and new[0]["role"] == "system" and req.surface["body"].get("instructions"):
        # instructions are not carried over: this call's replace the earlier call's
        earlier = [new[0], *(earlier[1:] if earlier[0].get("role") == "system" else earlier)]
        new = new[1:]
    chat = {**req.body, "messages": earlier + new}
    check_chat(chat)
    return Request(chat, surface=req.surface)


def input_messages(items: Any, path: str) -> list[dict]:
    """Chat messages for `input` (a string, or a list of items)."""
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
        elif kind == "function_call":
            for name in ("call_id", "name", "arguments"):
                if not isinstance(it.get(name), str):
                    raise _bad("must be a string", f"{p}.{name}")
            if turn is None:
                turn = {"reasoning": None, "text": [], "calls": []}
            turn["calls"].append({"id": it["call_id"], "type": "function",
                                  "function": {"name": it["name"], "arguments": it["arguments"]}})
        elif kind == "function_call_output":
            if not isinstance(it.get("call_id"), str):
                raise _bad("must be a string", f"{p}.call_id")
            flush()
            out.append({"role": "tool", "tool_call_id": it["call_id"],
                        "content": _text_content(it.get("output"), f"{p}.output")})
        else:
            raise _bad(f"items of type {kind!r} are not supported (this proxy serves messages, reasoning, "
                       "function_call and function_call_output items)", f"{p}.type", "unsupported_item")
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


def _tools(tools: list) -> list[dict]:
    out = []
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        if not isinstance(t, dict):
            raise _bad("must be an object", p)
        if t.get("type") != "function":
            raise _bad(f"the hosted tool {t.get('type')!r} is not supported: this proxy serves function tools "
                       "only (run the tool in the harness and declare it as a function)", f"{p}.type",
                       "unsupported_tool")
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise _bad("must be a non-empty string", f"{p}.name")
        fn: dict[str, Any] = {"name": t["name"]}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        if t.get("parameters") is not None:
            if not isinstance(t["parameters"], dict):
                raise _bad("must be a JSON schema object", f"{p}.parameters")
            fn["parameters"] = t["parameters"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad("must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...} (hosted tools are not "
               "served here)", "tool_choice")


def _response_format(fmt: Any) -> dict | None:
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("name"), str) or not isinstance(fmt.get("schema"), dict):
            raise _bad("a json_schema format needs a string 'name' and an object 'schema'", "text.format")
        spec = {k: fmt[k] for k in ("name", "schema", "description", "strict") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": spec}
    raise _bad("type must be 'text', 'json_object' or 'json_schema'", "text.format.type")
