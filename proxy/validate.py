"""Request bodies checked before anything is forwarded or written: a bad request gets an
OpenAI-shaped 400 naming the parameter, and nothing is recorded."""

from __future__ import annotations

from typing import Any

import orjson

from harnessrl.proxy.errors import bad_request

_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def parse_json(body: bytes) -> dict:
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(req, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    return req


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_common(req: dict) -> None:
    checks = (
        ("model", lambda v: isinstance(v, str), "a string"),
        ("stream", lambda v: isinstance(v, bool), "a boolean"),
        ("max_tokens", lambda v: _is_int(v) and v >= 0, "a non-negative integer"),
        ("max_completion_tokens", lambda v: _is_int(v) and v >= 0, "a non-negative integer"),
        ("temperature", lambda v: _is_num(v) and v >= 0, "a non-negative number"),
        ("top_p", lambda v: _is_num(v) and 0 < v <= 1, "a number in (0, 1]"),
        ("seed", _is_int, "an integer"),
        ("n", lambda v: _is_int(v) and 1 <= v <= 64, "an integer in [1, 64]"),
        ("stop", lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)),
         "a string or a list of strings"),
        ("stream_options", lambda v: isinstance(v, dict), "an object"),
    )
    for name, ok, what in checks:
        if req.get(name) is not None and not ok(req[name]):
            raise bad_request(f"'{name}' must be {what}", param=name, code="invalid_type")


def check_chat(req: dict) -> None:
    msgs = req.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("'messages' must be a non-empty list of messages", param="messages", code="invalid_type")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise bad_request(f"messages[{i}] must be an object with a role in {sorted(_ROLES)}",
                              param=f"messages[{i}]", code="invalid_type")
        c = m.get("content")
        if c is not None and not isinstance(c, (str, list)):
            raise bad_request(f"messages[{i}].content must be a string, a list of parts or null",
                              param=f"messages[{i}].content", code="invalid_type")
        tcs = m.get("tool_calls")
        if tcs is not None and not (isinstance(tcs, list) and all(isinstance(t, dict) for t in tcs)):
            raise bad_request(f"messages[{i}].tool_calls must be a list of objects",
                              param=f"messages[{i}].tool_calls", code="invalid_type")
    tools = req.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise bad_request("'tools' must be a list of tool objects", param="tools", code="invalid_type")
    for name, ok, what in (("logprobs", lambda v: isinstance(v, bool), "a boolean"),
                           ("top_logprobs", lambda v: _is_int(v) and 0 <= v <= 20, "an integer in [0, 20]")):
        if req.get(name) is not None and not ok(req[name]):
            raise bad_request(f"'{name}' must be {what}", param=name, code="invalid_type")
    _check_common(req)


def check_completion(req: dict) -> None:
    p = req.get("prompt")
    ok = isinstance(p, str) or (isinstance(p, list) and len(p) > 0 and (
        all(_is_int(t) and t >= 0 for t in p) or (len(p) == 1 and isinstance(p[0], str))))
    if not ok:
        raise bad_request("'prompt' must be a string, a one-element list of strings, or a list of token ids",
                          param="prompt", code="invalid_type")
    if req.get("logprobs") is not None and not (_is_int(req["logprobs"]) and 0 <= req["logprobs"] <= 5):
        raise bad_request("'logprobs' must be an integer in [0, 5]", param="logprobs", code="invalid_type")
    _check_common(req)
