"""Constrained decoding on the local backend: `response_format` (json_object, json_schema) and
`tool_choice` ("required", or a named function) enforced token by token.

The grammar engine is xgrammar, the default structured-output backend of vLLM, so the local
backend enforces these fields the way the upstream it stands in for does; its token masks work
on CPU tensors with any Hugging Face tokenizer. A forced tool call is one hermes block, in the
shape the chat template renders tool calls (`<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>`),
with the arguments held to the tool's JSON schema; then only the end-of-turn token is allowed.

Log-probs of a constrained sample are those of the masked distribution it was drawn from
(what the behaviour policy really was), like the temperature and top-p the local backend
already applies.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import orjson

from harnessrl.proxy.errors import bad_request

_SEPARATORS = (", ", ": ")  # as the chat template and json.dumps write JSON


def forced_tool(body: dict) -> tuple[bool, str | None]:
    """(a tool call is required, the name it must call or None for any of the tools), checked
    against the request's tools; (False, None) when the model may answer freely."""
    choice, tools = body.get("tool_choice"), body.get("tools") or []
    names = [(t.get("function") or {}).get("name") for t in tools]
    if choice == "required":
        if not tools:
            raise bad_request("tool_choice 'required' needs 'tools'", param="tool_choice", code="invalid_value")
        return True, None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if choice.get("type") != "function" or not isinstance(name, str):
            raise bad_request("tool_choice must be 'none', 'auto', 'required' or "
                              "{'type': 'function', 'function': {'name': ...}}", param="tool_choice",
                              code="invalid_value")
        if name not in names:
            raise bad_request(f"tool_choice names the function {name!r}, which is not in 'tools'",
                              param="tool_choice", code="invalid_value")
        return True, name
    if choice not in (None, "auto", "none"):
        raise bad_request("tool_choice must be 'none', 'auto', 'required' or a named function", param="tool_choice",
                          code="invalid_value")
    return False, None


def response_schema(body: dict) -> dict | None:
    """The JSON schema a `response_format` asks for ({"type": "object"} for json_object), or None."""
    rf = body.get("response_format")
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        schema = (rf.get("json_schema") or {}).get("schema") if isinstance(rf.get("json_schema"), dict) else None
        if not isinstance(schema, dict):
            raise bad_request("response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}",
                              param="response_format", code="invalid_value")
        return schema
    raise bad_request("response_format type must be 'text', 'json_object' or 'json_schema'", param="response_format",
                      code="invalid_value")


def _tool_schema(tools: list[dict], name: str | None) -> dict:
    """The JSON of one hermes tool call to any of the tools (or the named one)."""
    options = []
    for t in tools:
        fn = t.get("function") or {}
        if name is None or fn.get("name") == name:
            params = fn.get("parameters") or {"type": "object"}
            options.append({"type": "object", "properties": {"name": {"const": fn.get("name")}, "arguments": params},
                            "required": ["name", "arguments"], "additionalProperties": False})
    return options[0] if len(options) == 1 else {"anyOf": options}


class Constraint:
    """One sample's grammar state: masks the logits before each token, advances on each token."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def mask(self, logits: Any) -> None:
        """Set every token the grammar forbids next to -inf (in place; a 1-D CPU tensor)."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        self._xgr.apply_token_bitmask_inplace(logits, self._bitmask.to(logits.device))

    def accept(self, token: int) -> None:
        self._matcher.accept_token(token)


class Constrainer:
    """Compiles (and caches) the grammar of a request for one tokenizer."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: frozenset[int]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_ids))
        self._compiler = xgr.GrammarCompiler(info)
        self._cache: OrderedDict[bytes, Any] = OrderedDict()

    def compiled(self, body: dict) -> Any | None:
        """The compiled grammar `body` asks for, or None; a 400 for a field it cannot honour."""
        required, name = forced_tool(body)
        schema = None if required else response_schema(body)
        if not required and schema is None:
            return None
        key = orjson.dumps([required, name, body.get("tools") if required else schema], option=orjson.OPT_SORT_KEYS)
        got = self._cache.get(key)
        if got is None:
            got = self._compile(body.get("tools") or [], name) if required else self._json(schema, "response_format")
            self._cache[key] = got
            if len(self._cache) > 256:
                self._cache.popitem(last=False)
        return got

    def constraint(self, compiled: Any) -> Constraint:
        return Constraint(compiled, self.vocab_size)

    def _grammar(self, schema: dict, param: str) -> Any:
        try:
            return self._xgr.Grammar.from_json_schema(orjson.dumps(schema).decode(), any_whitespace=False,
                                                      separators=_SEPARATORS)
        except Exception as exc:  # noqa: BLE001 - the harness's schema
            raise bad_request(f"cannot enforce the JSON schema: {str(exc).splitlines()[0][:300]}", param=param,
                              code="invalid_schema") from None

    def _json(self, schema: dict, param: str) -> Any:
        return self._compiler.compile_grammar(self._grammar(schema, param))

    def _compile(self, tools: list[dict], name: str | None) -> Any:
        g = self._xgr.Grammar
        call = self._grammar(_tool_schema(tools, name), "tools")
        return self._compiler.compile_grammar(
            g.concat(g.from_ebnf('root ::= "<tool_call>\\n"'), call, g.from_ebnf('root ::= "\\n</tool_call>"')))
