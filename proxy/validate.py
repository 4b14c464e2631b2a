"""Request bodies checked before anything is forwarded or written: a bad request gets an
OpenAI-shaped 400 naming the parameter by its path (`messages[1].tool_calls[0].function`), and
nothing is recorded. Everything later code reads from a body is checked here, so a malformed
body can reach neither a route, nor the prefix index, nor the records DB."""

from __future__ import annotations

import re
from typing import Any

import orjson

from harnessrl.proxy.errors import bad_request

_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
_TOOL_CHOICES = {"none", "auto", "required"}
MODEL_MAX = 256  # the calls.model column
# orjson reads 1,024 levels of nesting but writes only 254: a body nested deeper could be read,
# then not forwarded or recorded (a 500); it is refused here
MAX_DEPTH = 254
# `seed`: what vLLM takes (its protocol bounds it to torch.long) and what orjson writes
SEED_MIN, SEED_MAX = -(2 ** 63), 2 ** 63 - 1


def parse_json(body: bytes) -> dict:
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(req, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH:  # only then can it be nested that deep
        try:
            orjson.dumps(req)
        except orjson.JSONEncodeError:
            raise bad_request(f"request body is nested more than {MAX_DEPTH} levels deep",
                              code="invalid_json") from None
    return req


def is_int(v: Any) -> bool:
    """An integer, not a bool (JSON true is not 1); the surfaces' checks use these too."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _bad(path: str, what: str):
    return bad_request(f"'{path}' must be {what}", param=path, code="invalid_type")


def _opt(obj: dict, name: str, ok, what: str, at: str = "") -> None:
    """`obj[name]`, when present and not null, must pass `ok`."""
    if obj.get(name) is not None and not ok(obj[name]):
        raise _bad(f"{at}{name}", what)


_CONTROL = re.compile(r"[\x00-\x1f]")  # searched in C, not character by character in Python


def valid_model(v: Any) -> bool:
    # stored in a 256-character column; a control character (a NUL) no database takes as text
    return isinstance(v, str) and len(v) <= MODEL_MAX and _CONTROL.search(v) is None


def _stop(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and len(v) <= 4 and all(isinstance(s, str) for s in v))


def _logit_bias(v: Any) -> bool:
    return isinstance(v, dict) and all(k.isascii() and k.isdigit() and is_num(b) and -100 <= b <= 100
                                       for k, b in v.items())


# (parameter, check, what it must be): built once, not per request
_COMMON = (
    ("model", valid_model, f"a string of at most {MODEL_MAX} characters without control characters"),
    ("stream", lambda v: isinstance(v, bool), "a boolean"),
    ("max_tokens", lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    ("max_completion_tokens", lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    ("temperature", lambda v: is_num(v) and 0 <= v <= 2, "a number in [0, 2]"),
    ("top_p", lambda v: is_num(v) and 0 < v <= 1, "a number in (0, 1]"),
    ("presence_penalty", lambda v: is_num(v) and -2 <= v <= 2, "a number in [-2, 2]"),
    ("frequency_penalty", lambda v: is_num(v) and -2 <= v <= 2, "a number in [-2, 2]"),
    ("logit_bias", _logit_bias, "an object mapping token ids to numbers in [-100, 100]"),
    ("seed", lambda v: is_int(v) and SEED_MIN <= v <= SEED_MAX, "an integer in [-2^63, 2^63-1]"),
    ("n", lambda v: is_int(v) and 1 <= v <= 64, "an integer in [1, 64]"),
    ("stop", _stop, "a string or a list of at most 4 strings"),
    ("stream_options", lambda v: isinstance(v, dict) and v.get("include_usage") in (None, True, False),
     "an object (include_usage: a boolean)"),
    ("user", _is_str, "a string"),
)


def _check_common(req: dict) -> None:
    for name, ok, what in _COMMON:
        if name in req:  # a body names a few of these: the call only for those
            _opt(req, name, ok, what)


def _check_parts(parts: list, at: str) -> None:
    for j, p in enumerate(parts):
        here = f"{at}[{j}]"
        if not isinstance(p, dict) or not isinstance(p.get("type"), str):
            raise _bad(here, "a content part: an object with a string 'type'")
        if p["type"] == "text" and not isinstance(p.get("text"), str):
            raise _bad(f"{here}.text", "a string")
        if p["type"] == "refusal" and not isinstance(p.get("refusal"), str):
            raise _bad(f"{here}.refusal", "a string")
        if p["type"] == "image_url" and not (isinstance(p.get("image_url"), dict)
                                             and isinstance(p["image_url"].get("url"), str)):
            raise _bad(f"{here}.image_url", "an object with a string 'url'")


def _check_function_call(f: Any, at: str) -> None:
    if not isinstance(f, dict):
        raise _bad(at, "an object with a string 'name' and string 'arguments'")
    if not isinstance(f.get("name"), str):
        raise _bad(f"{at}.name", "a string")
    if not isinstance(f.get("arguments"), str):
        raise _bad(f"{at}.arguments", "a string (the arguments as JSON text)")


def _check_tool_calls(tcs: Any, at: str) -> None:
    if not isinstance(tcs, list):
        raise _bad(at, "a list of tool calls")
    for j, tc in enumerate(tcs):
        here = f"{at}[{j}]"
        if not isinstance(tc, dict):
            raise _bad(here, "a tool call object")
        _opt(tc, "id", _is_str, "a string", f"{here}.")
        _opt(tc, "type", lambda v: v == "function", "'function'", f"{here}.")
        _check_function_call(tc.get("function"), f"{here}.function")


_PLAIN = frozenset(("role", "content"))


def _check_message(m: Any, at: str) -> None:
    if not isinstance(m, dict):
        raise _bad(at, "a message object")
    role = m.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise bad_request(f"'{at}.role' must be one of {sorted(_ROLES)}", param=f"{at}.role", code="invalid_type")
    c = m.get("content")
    if isinstance(c, str) and _PLAIN.issuperset(m):  # most messages: nothing else to check
        return
    if isinstance(c, list):
        _check_parts(c, f"{at}.content")
    elif c is not None and not isinstance(c, str):
        raise _bad(f"{at}.content", "a string, a list of content parts or null")
    for name in ("name", "tool_call_id", "refusal", "reasoning", "reasoning_content"):
        _opt(m, name, _is_str, "a string", f"{at}.")
    if m.get("tool_calls") is not None:
        _check_tool_calls(m["tool_calls"], f"{at}.tool_calls")
    if m.get("function_call") is not None:
        _check_function_call(m["function_call"], f"{at}.function_call")


def _check_tools(tools: Any) -> None:
    if not isinstance(tools, list):
        raise _bad("tools", "a list of tools")
    for i, t in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            raise _bad(at, "an object with type 'function' and a 'function' object")
        f = t.get("function")
        if not isinstance(f, dict):
            raise _bad(f"{at}.function", "an object with a string 'name'")
        if not isinstance(f.get("name"), str) or not f["name"]:
            raise _bad(f"{at}.function.name", "a non-empty string")
        _opt(f, "description", _is_str, "a string", f"{at}.function.")
        _opt(f, "parameters", lambda v: isinstance(v, dict), "a JSON Schema object", f"{at}.function.")
        _opt(f, "strict", lambda v: isinstance(v, bool), "a boolean", f"{at}.function.")


def _tool_choice(v: Any) -> bool:
    if isinstance(v, str):
        return v in _TOOL_CHOICES
    return (isinstance(v, dict) and v.get("type") == "function" and isinstance(v.get("function"), dict)
            and isinstance(v["function"].get("name"), str))


def check_chat(req: dict) -> None:
    msgs = req.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("'messages' must be a non-empty list of messages", param="messages", code="invalid_type")
    for i, m in enumerate(msgs):
        _check_message(m, f"messages[{i}]")
    if req.get("tools") is not None:
        _check_tools(req["tools"])
    _opt(req, "tool_choice", _tool_choice,
         "'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}")
    _opt(req, "parallel_tool_calls", lambda v: isinstance(v, bool), "a boolean")
    _opt(req, "response_format", lambda v: isinstance(v, dict) and isinstance(v.get("type"), str),
         "an object with a string 'type'")
    _opt(req, "logprobs", lambda v: isinstance(v, bool), "a boolean")
    _opt(req, "top_logprobs", lambda v: is_int(v) and 0 <= v <= 20, "an integer in [0, 20]")
    _check_common(req)


def check_completion(req: dict) -> None:
    p = req.get("prompt")
    ok = isinstance(p, str) or (isinstance(p, list) and len(p) > 0 and (
        all(is_int(t) and 0 <= t < 2**31 for t in p) or (len(p) == 1 and isinstance(p[0], str))))
    if not ok:
        raise bad_request("'prompt' must be a string, a one-element list of strings, or a list of token ids",
                          param="prompt", code="invalid_type")
    _opt(req, "logprobs", lambda v: is_int(v) and 0 <= v <= 5, "an integer in [0, 5]")
    _check_common(req)
