"""The OpenAI Responses API, request side: a `POST /v1/responses` body, checked with errors that
name its own fields (`input[2].content[0].type`), translated to the internal chat body. Every
field is translated by one of these rules or refused with a 400 naming it:

- `input` items: `surfaces.responses.items`; tools (`tools`, `additional_tools` items), `tool_choice`:
  `surfaces.responses.tools`; `instructions` → the first system message; `max_output_tokens` →
  `max_tokens`; `text.format` → `response_format`; `include` with
  `message.output_text.logprobs` → log-probs (other `include` values ask for data of hosted tools
  or encrypted reasoning, which this proxy does not produce: nothing to add);
- `previous_response_id`: the earlier call is read from the records (`resolve`): its messages,
  its answer, then the new input, so the prompt extends the earlier one token-exactly (the prefix
  index finds that call as for chat); over the WebSocket transport the connection's last response
  is found even with `store: false` (`surfaces.responses.websocket`);
- recorded with the call and otherwise ignored (they tune a hosted service): `metadata`,
  `client_metadata`, `reasoning`, `truncation`, `prompt_cache_key`, `prompt_cache_retention`,
  `prompt_cache_options`, `service_tier`, `safety_identifier`, `user`, `stream_options`,
  `context_management`, `max_tool_calls`, `text.verbosity`;
- refused: `background`, `conversation`, `prompt` (services this proxy does not run) and
  `generate: false` over HTTP (a WebSocket warm-up, served by `surfaces.responses.websocket`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.protocol import Request
from harnessrl.proxy.surfaces.responses.items import input_messages
from harnessrl.proxy.surfaces.responses.tools import _bad, tool_choice, tool_map
from harnessrl.proxy.surfaces.hosted_tools import REMOVED_NOTE, Removed
from harnessrl.proxy.validate import check_chat, is_int, is_num

RESPONSE_PREFIX = "resp_"
LOGPROBS_INCLUDE = "message.output_text.logprobs"
# the tools the conversation declared: in additional_tools items (shown), by a client tool search (loaded)
CONTEXT_NOTE = "harnessrl_context_tools"
LOADED_NOTE = "harnessrl_loaded_tools"
# set to anything but these, a field asks for a service this proxy does not run
_UNSUPPORTED = {"background": (None, False), "conversation": (None,), "prompt": (None,), "generate": (None, True)}
_TRANSLATED = {"model", "input", "instructions", "stream", "store", "tools", "tool_choice", "parallel_tool_calls",
               "max_output_tokens", "temperature", "top_p", "top_logprobs", "previous_response_id", "include",
               "text"}
_IGNORED = {"metadata", "client_metadata", "reasoning", "truncation", "prompt_cache_key", "prompt_cache_retention",
            "prompt_cache_options", "service_tier", "safety_identifier", "user", "stream_options",
            "context_management", "max_tool_calls"}
_TEXT = {"format", "verbosity"}


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


def to_request(body: dict, strict_tools: bool = False) -> Request:
    """The chat `Request` for a Responses body (400 naming the field when it is malformed); hosted
    tools removed (recorded in its notes) or, with `strict_tools`, refused."""
    for name in body:
        if name not in _TRANSLATED and name not in _IGNORED and name not in _UNSUPPORTED:
            raise _bad("is not supported by this proxy", name, "unsupported_parameter")
    for name, ok, what in _CHECKS:
        if body.get(name) is not None and not ok(body[name]):
            raise _bad(what, name)
    for name, allowed in _UNSUPPORTED.items():
        if body.get(name) not in allowed:
            raise _bad("is not supported by this proxy (it records calls it serves now; keep the conversation "
                       "in the input or use previous_response_id)", name, "unsupported_parameter")
    for key in body.get("text") or {}:
        if key not in _TEXT:
            raise _bad("is not supported by this proxy", f"text.{key}", "unsupported_parameter")
    if "input" not in body:
        raise _bad("is required", "input", "missing_required_parameter")
    messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    context: list = []
    messages += input_messages(body["input"], "input", context)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "stream": bool(body.get("stream"))}
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("parallel_tool_calls", "parallel_tool_calls")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    fmt = _response_format((body.get("text") or {}).get("format"))
    if fmt is not None:
        chat["response_format"] = fmt
    if LOGPROBS_INCLUDE in (body.get("include") or ()):
        chat["logprobs"] = True
        if body.get("top_logprobs") is not None:
            chat["top_logprobs"] = body["top_logprobs"]
    req = Request(chat, surface={"api": "responses", "body": body})
    _set_tools(req, context, Removed(strict_tools))
    if body.get("previous_response_id") is None:
        check_chat(chat)
    return req


def _set_tools(req: Request, context: list, removed: Removed) -> None:
    """The call's tools: the body's, then the conversation's (`context`: [path, tool, shown])."""
    body = req.surface["body"]
    tools = tool_map(body.get("tools") or [], context, removed)
    req.body.pop("tools", None)
    if tools.shown:
        req.body["tools"] = tools.shown
    if body.get("tool_choice") is not None:
        # with previous_response_id the earlier call's tools join in `resolve`, which checks the name
        chosen = None if body.get("previous_response_id") is not None else tools.shown
        req.body["tool_choice"] = tool_choice(body["tool_choice"], chosen)
    req.surface["tool_names"] = tools.names  # how the model's calls map back (`surfaces.responses.wire`)
    notes = {k: v for k, v in (req.notes or {}).items() if k not in (REMOVED_NOTE, CONTEXT_NOTE, LOADED_NOTE)}
    notes.update(removed.notes() or {})
    for key, shown in ((CONTEXT_NOTE, True), (LOADED_NOTE, False)):
        if any(s is shown for _, _, s in context):
            notes[key] = [t for _, t, s in context if s is shown]
    req.notes = notes or None


async def resolve(req: Request, fetch: Callable[[str], Awaitable[dict | None]]) -> Request:
    """With `previous_response_id`: the earlier conversation + its answer + the new input, and the
    earlier conversation's tools before this call's."""
    prev_id = (req.surface or {}).get("body", {}).get("previous_response_id")
    if prev_id is None:
        return req
    prev = await fetch(prev_id[len(RESPONSE_PREFIX):]) if prev_id.startswith(RESPONSE_PREFIX) else None
    if prev is None or prev["api"] != "responses" or not prev["store"] or not prev["ok"]:
        raise ProxyError(400, f"previous response with id {prev_id!r} not found", param="previous_response_id",
                         code="previous_response_not_found")
    # a warm-up (`generate: false`) has no answer
    earlier = [*prev["messages"], *([prev["reply"]] if prev["reply"] is not None else [])]
    new = req.body["messages"]
    if new and new[0]["role"] == "system" and req.surface["body"].get("instructions"):
        # instructions are not carried over: this call's replace the earlier call's
        earlier = [new[0], *(earlier[1:] if earlier and earlier[0].get("role") == "system" else earlier)]
        new = new[1:]
    out = Request({**req.body, "messages": earlier + new}, surface=req.surface, notes=req.notes)
    def declared(tools: dict, at: str) -> list:
        return [[f"{at}.tools[{k}]", t, shown] for key, shown in (("context_tools", True), ("loaded_tools", False))
                for k, t in enumerate(tools.get(key) or ())]

    before = declared(prev, "previous_response_id")
    mine = declared({"context_tools": (req.notes or {}).get(CONTEXT_NOTE),
                     "loaded_tools": (req.notes or {}).get(LOADED_NOTE)}, "input")
    if before:  # (paths as the tools are recorded: validated, and hosted ones removed, when first sent)
        _set_tools(out, before + mine, Removed())
    if req.surface["body"].get("tool_choice") is not None:
        tool_choice(req.surface["body"]["tool_choice"], out.body.get("tools") or [])
    check_chat(out.body)
    return out


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
