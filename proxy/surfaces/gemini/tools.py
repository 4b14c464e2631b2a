"""Gemini tools → the chat tools the model sees, and `toolConfig` → `tool_choice`.

- `tools[].functionDeclarations[]`: a function each — `parameters` (Gemini's schema dialect,
  `surfaces.gemini.schema`) or `parametersJsonSchema` (JSON Schema, as sent) its parameters.
  Recorded with the call and otherwise ignored: `response` / `responseJsonSchema` (what the
  function returns: a chat tool has no place for it) and `behavior` (blocking or not is the
  harness's business).
- A hosted tool (`googleSearch`, `googleSearchRetrieval`, `codeExecution`, `urlContext`,
  `computerUse`, `fileSearch`, `googleMaps`, `retrieval`, `enterpriseWebSearch`): removed and
  recorded, or refused with --strict-tools (`surfaces.hosted_tools`). `mcpServers`: refused.
- `toolConfig.functionCallingConfig.mode`: AUTO → auto, NONE → none, ANY → required (one name in
  `allowedFunctionNames` → that function), VALIDATED → auto (the local backend constrains a
  called tool's arguments either way). `allowedFunctionNames` naming some but not all of several
  functions is refused: the chat contract has no "one of these" choice. `retrievalConfig` and
  `includeServerSideToolInvocations` (hosted tools' settings) are recorded and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harnessrl.proxy.surfaces.gemini.fields import bad, fields, listed, spellings, string
from harnessrl.proxy.surfaces.gemini.schema import json_schema
from harnessrl.proxy.surfaces.hosted_tools import Removed

_HOSTED = ("googleSearch", "googleSearchRetrieval", "codeExecution", "urlContext", "computerUse", "fileSearch",
           "googleMaps", "retrieval", "enterpriseWebSearch")
_TOOL = spellings("functionDeclarations", "mcpServers", *_HOSTED)
_DECLARATION = spellings("name", "description", "parameters", "parametersJsonSchema", "response",
                         "responseJsonSchema", "behavior")
_TOOL_CONFIG = spellings("functionCallingConfig", "retrievalConfig", "includeServerSideToolInvocations")
_CALLING = spellings("mode", "allowedFunctionNames", "streamFunctionCallArguments")
_MODES = {"AUTO": "auto", "NONE": "none", "ANY": "required", "VALIDATED": "auto", "MODE_UNSPECIFIED": "auto"}


@dataclass
class Tools:
    shown: list[dict] = field(default_factory=list)  # chat tools, in the order declared


def tools(declared: list, removed: Removed) -> Tools:
    out = Tools()
    names: set[str] = set()
    for i, t in enumerate(declared):
        p = f"tools[{i}]"
        tool = fields(t, p, _TOOL)
        if tool.get("mcpServers"):
            raise bad(f"{p}.mcpServers", "MCP servers are not supported by this proxy (connect them in the harness)")
        for kind in _HOSTED:
            if kind in tool:
                removed.hosted(f"{p}.{kind}", kind, None)
        for j, d in enumerate(listed(tool, "functionDeclarations", p)):
            fn = _function(d, f"{p}.functionDeclarations[{j}]")
            if fn["name"] in names:
                raise bad(f"{p}.functionDeclarations[{j}].name", f"{fn['name']!r} is declared twice")
            names.add(fn["name"])
            out.shown.append({"type": "function", "function": fn})
    return out


def _function(d: Any, p: str) -> dict:
    decl = fields(d, p, _DECLARATION)
    name = string(decl, "name", p, required=True)
    if not name:
        raise bad(f"{p}.name", "is required")
    fn: dict[str, Any] = {"name": name}
    description = string(decl, "description", p)
    if description is not None:
        fn["description"] = description
    if "parameters" in decl and "parametersJsonSchema" in decl:
        raise bad(f"{p}.parametersJsonSchema", "only one of parameters and parametersJsonSchema may be set")
    if "parameters" in decl:
        fn["parameters"] = json_schema(decl["parameters"], f"{p}.parameters")
    elif "parametersJsonSchema" in decl:
        if not isinstance(decl["parametersJsonSchema"], dict):
            raise bad(f"{p}.parametersJsonSchema", "must be a JSON Schema object")
        fn["parameters"] = decl["parametersJsonSchema"]
    return fn


def tool_choice(config: Any, shown: list[dict]) -> dict:
    """The chat `tool_choice` for a `toolConfig` (empty: the default, auto)."""
    cfg = fields(config, "toolConfig", _TOOL_CONFIG)
    calling = cfg.get("functionCallingConfig")
    if calling is None:
        return {}
    p = "toolConfig.functionCallingConfig"
    c = fields(calling, p, _CALLING)
    mode = c.get("mode", "AUTO")
    if not isinstance(mode, str) or mode.upper() not in _MODES:
        raise bad(f"{p}.mode", f"must be one of {', '.join(_MODES)}")
    choice = _MODES[mode.upper()]
    allowed = listed(c, "allowedFunctionNames", p)
    if allowed:
        if choice != "required":
            raise bad(f"{p}.allowedFunctionNames", "may only be set with mode ANY")
        declared = [t["function"]["name"] for t in shown]
        for k, name in enumerate(allowed):
            if not isinstance(name, str) or name not in declared:
                raise bad(f"{p}.allowedFunctionNames[{k}]", "must name a function declared in tools")
        if len(set(allowed)) == 1:
            return {"tool_choice": {"type": "function", "function": {"name": allowed[0]}}}
        if set(allowed) != set(declared):
            raise bad(f"{p}.allowedFunctionNames", "naming some but not all of the declared functions is not "
                                                   "supported by this proxy (name one, or all)")
    return {"tool_choice": choice}
