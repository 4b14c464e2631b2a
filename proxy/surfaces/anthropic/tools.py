"""Anthropic Messages tools → the chat tools the model sees.

- A client tool (no `type`, or `custom`): a function — `input_schema` its parameters, `strict`
  passed on. Accepted and ignored: `cache_control` (a prompt-caching hint) and
  `eager_input_streaming` (OpenCode sets it: a tool call's input is streamed as it is generated
  here anyway).
- `defer_loading: true` (tool search, as Claude Code sends it once a tool is searched for): the
  tool is not in the tools the model is shown up front; a `tool_reference` block naming it (in a
  `tool_result`) is rendered in place as the tool's definition — the JSON the chat template shows
  for a tool — which is where Anthropic's API expands it too.
- A hosted server tool (`web_search_*`, `web_fetch_*`, `code_execution_*`,
  `tool_search_tool_regex_*` / `_bm25_*`, `mcp_toolset`): removed and recorded, or refused with
  --strict-tools (`surfaces.hosted_tools`).
- An Anthropic-defined client tool (`bash_*`, `text_editor_*`, `computer_*`, `memory_*`): the
  harness runs it, but its schema is Anthropic's and not sent: refused with a 400 naming it
  (declare it as a client tool with an `input_schema`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from harnessrl.proxy.errors import ProxyError, bad_request
from harnessrl.proxy.surfaces.hosted_tools import Removed

_HOSTED = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_", "mcp_toolset")
_SCHEMA_LESS = ("bash_", "text_editor_", "computer_", "memory_")
_KEYS = {"type", "name", "description", "input_schema", "cache_control", "defer_loading", "strict",
         "eager_input_streaming"}


def _bad(path: str, message: str) -> ProxyError:
    return bad_request(f"{path}: {message}", param=path)


@dataclass
class Tools:
    shown: list[dict] = field(default_factory=list)  # chat tools, in the order declared
    functions: dict[str, dict] = field(default_factory=dict)  # every client tool's function, by name


def tools(declared: list, removed: Removed) -> Tools:
    out = Tools()
    for i, t in enumerate(declared):
        p = f"tools.{i}"
        if not isinstance(t, dict):
            raise _bad(p, "must be an object")
        kind = t.get("type")
        if kind not in (None, "custom"):
            if not isinstance(kind, str):
                raise _bad(f"{p}.type", "must be a string")
            if kind.startswith(_HOSTED):
                removed.hosted(f"{p}.type", kind, t.get("name"))
                continue
            why = ("is an Anthropic-defined tool whose schema is not sent: declare it as a client tool with an "
                   "input_schema" if kind.startswith(_SCHEMA_LESS) else "is not a tool type this proxy knows")
            raise _bad(f"{p}.type", f"{kind!r} {why}")
        for key in t:
            if key not in _KEYS:
                raise _bad(f"{p}.{key}", "is not supported by this proxy")
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise _bad(f"{p}.name", "field required")
        if not isinstance(t.get("input_schema"), dict):
            raise _bad(f"{p}.input_schema", "field required (a JSON schema object)")
        if t["name"] in out.functions:
            raise _bad(f"{p}.name", f"{t['name']!r} is declared twice")
        fn: dict[str, Any] = {"name": t["name"]}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        fn["parameters"] = t["input_schema"]
        if t.get("strict") is not None:
            fn["strict"] = t["strict"]
        out.functions[t["name"]] = fn
        if not t.get("defer_loading"):
            out.shown.append({"type": "function", "function": fn})
    return out


def tool_reference(block: dict, path: str, known: dict[str, dict]) -> str:
    """A `tool_reference` block as the text the model reads: the tool's definition."""
    name = block.get("tool_name")
    if not isinstance(name, str) or name not in known:
        raise _bad(f"{path}.tool_name", "must name a client tool declared in tools")
    return json.dumps(known[name], ensure_ascii=False)


def tool_choice(choice: Any, shown: list[dict]) -> dict:
    kind = choice.get("type") if isinstance(choice, dict) else None
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind or "")
    if kind == "tool" and isinstance(choice.get("name"), str):
        if all(t["function"]["name"] != choice["name"] for t in shown):
            raise _bad("tool_choice.name", f"{choice['name']!r} is not among the tools the model is shown (a hosted "
                                           "tool is removed, a deferred one shown only where referenced)")
        mapped = {"type": "function", "function": {"name": choice["name"]}}
    if mapped is None:
        raise _bad("tool_choice", "must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}")
    out: dict[str, Any] = {"tool_choice": mapped}
    if choice.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False
    return out
