"""Responses tools → the chat tools the model sees, and the model's calls back to the tools the
harness declared. Rules (every tool type is one of these, or a 400 naming it):

- `function`: a chat function (`parameters`, `strict` passed on). `defer_loading` is accepted, but
  this proxy runs no tool search, so a deferred tool is shown up front.
- `custom` (a freeform tool, Codex's `apply_patch`): a function of one string argument `input`;
  a grammar `format` (lark or regex) is appended to the description, where the model reads it —
  it is not enforced. The model's call comes back as a `custom_tool_call` item whose `input` is
  that argument (the raw arguments when they are not such an object); in the input,
  `custom_tool_call` / `custom_tool_call_output` items are function calls / tool messages.
- `namespace` (a group of function and custom tools): flattened, each shown as
  `<namespace>.<name>` (how OpenAI's own models address a namespaced tool), the namespace's
  description leading each tool's; calls come back with `name` and `namespace` apart.
- `tool_search` run by the client (`execution: "client"`, Codex's search over its deferred tools):
  a function `tool_search` of its `parameters`; the model's call comes back as a
  `tool_search_call` item (its `arguments` an object). A `tool_search_output` input item is the
  tool message, holding the loaded tools' definitions as the model is shown tools (one JSON per
  line, flattened as here); the loaded tools are then callable — mapped back like declared ones —
  without joining the tools shown up front (recorded as `harnessrl_loaded_tools`).
- hosted tools (`web_search*`, `file_search`, `code_interpreter`, `image_generation`, `mcp`, a
  `tool_search` the provider runs): removed and recorded, or refused with --strict-tools
  (`surfaces.hosted_tools`).
- tools whose schema is the provider's (`local_shell`, `shell`, `apply_patch`, `computer*`): 400.

Tools come from the body's `tools` and from `additional_tools` input items (Codex declares its
tools there); those belong to the conversation, so a call that extends an earlier one by
`previous_response_id` keeps the earlier call's (recorded as `harnessrl_context_tools`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from harnessrl.proxy.errors import ProxyError, bad_request
from harnessrl.proxy.surfaces.hosted_tools import Removed

SEP = "."
_HOSTED = ("web_search", "file_search", "code_interpreter", "image_generation", "mcp", "tool_search")
_SCHEMA_LESS = ("local_shell", "shell", "apply_patch", "computer")
_INPUT = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"],
          "additionalProperties": False}


def _bad(message: str, param: str, code: str = "invalid_type") -> ProxyError:
    return bad_request(f"{param}: {message}", param=param, code=code)


def visible(namespace: str | None, name: str) -> str:
    """The name the model sees (and calls) for a tool."""
    return f"{namespace}{SEP}{name}" if namespace else name


@dataclass
class ToolMap:
    shown: list[dict] = field(default_factory=list)  # chat tools
    loaded: list[dict] = field(default_factory=list)  # the functions of tools a tool search loaded
    # the tools not shown under their own name or not functions: visible name -> [namespace, name, kind]
    names: dict[str, list] = field(default_factory=dict)

    seen: set = field(default_factory=set)  # every visible name, shown or loaded

    def add(self, t: Any, path: str, removed: Removed, namespace: str | None = None, lead: str = "",
            shown: bool = True) -> None:
        """Declare `t`; a tool loaded by a client tool search is callable but not `shown`."""
        if not isinstance(t, dict):
            raise _bad("must be an object", path)
        kind = t.get("type")
        if kind == "namespace" and namespace is None:
            self._namespace(t, path, removed, shown)
        elif kind in ("function", "custom") or (kind == "tool_search" and t.get("execution") == "client"
                                                and namespace is None):
            self._function(t, path, kind, namespace, lead, shown)
        elif isinstance(kind, str) and kind.startswith(_HOSTED) and namespace is None:
            removed.hosted(f"{path}.type", kind, t.get("name"))
        elif isinstance(kind, str) and kind.startswith(_SCHEMA_LESS):
            raise _bad(f"the tool {kind!r} has a schema this proxy does not know: declare it as a function or "
                       "custom tool", f"{path}.type", "unsupported_tool")
        else:
            raise _bad(f"tool type {kind!r} is not supported here (function, custom, namespace and hosted tools "
                       "are)", f"{path}.type", "unsupported_tool")

    def _namespace(self, t: dict, path: str, removed: Removed, shown: bool) -> None:
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise _bad("must be a non-empty string", f"{path}.name")
        if not isinstance(t.get("tools"), list):
            raise _bad("must be a list of function and custom tools", f"{path}.tools")
        lead = t.get("description") or ""
        if not isinstance(lead, str):
            raise _bad("must be a string", f"{path}.description")
        for j, inner in enumerate(t["tools"]):
            self.add(inner, f"{path}.tools[{j}]", removed, t["name"], lead, shown)

    def _function(self, t: dict, path: str, kind: str, namespace: str | None, lead: str, shown: bool) -> None:
        if kind == "tool_search":
            t = {**t, "name": "tool_search"}
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise _bad("must be a non-empty string", f"{path}.name")
        name = visible(namespace, t["name"])
        if name in self.seen:
            raise _bad(f"the tool {name!r} is declared twice", f"{path}.name")
        self.seen.add(name)
        desc = t.get("description")
        if desc is not None and not isinstance(desc, str):
            raise _bad("must be a string", f"{path}.description")
        desc = "\n\n".join(d for d in (lead, desc or "") if d)
        fn: dict[str, Any] = {"name": name}
        if kind == "custom":
            desc = "\n\n".join(d for d in (desc, _grammar(t.get("format"), f"{path}.format")) if d)
            fn["parameters"] = _INPUT
        elif t.get("parameters") is not None:
            if not isinstance(t["parameters"], dict):
                raise _bad("must be a JSON schema object", f"{path}.parameters")
            fn["parameters"] = t["parameters"]
        if t.get("strict") is not None and kind == "function":
            fn["strict"] = t["strict"]
        if desc:
            fn["description"] = desc
        if shown:
            self.shown.append({"type": "function", "function": fn})
        else:
            self.loaded.append(fn)
        if namespace or kind != "function":
            self.names[name] = [namespace, t["name"], kind]


def _grammar(fmt: Any, path: str) -> str:
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return ""
    if (not isinstance(fmt, dict) or fmt.get("type") != "grammar" or fmt.get("syntax") not in ("lark", "regex")
            or not isinstance(fmt.get("definition"), str)):
        raise _bad("must be {'type': 'text'} or {'type': 'grammar', 'syntax': 'lark' | 'regex', 'definition': "
                   "...}", path)
    return f"The input must match this {fmt['syntax']} grammar:\n{fmt['definition']}"


def tool_map(top: list, context: list, removed: Removed) -> ToolMap:
    """The tools of a call: the body's (`top`) then the conversation's (`context`: [path, tool,
    shown], shown False for the tools a tool search loaded)."""
    m = ToolMap()
    for i, t in enumerate(top):
        m.add(t, f"tools[{i}]", removed)
    for path, t, shown in context:
        m.add(t, path, removed, shown=shown)
    return m


def loaded_text(tools: list, path: str) -> str:
    """A `tool_search_output`'s tools as the model reads them: each function's definition, one
    JSON a line, flattened as shown tools are (a hosted tool among them is a 400)."""
    m = ToolMap()
    for j, t in enumerate(tools):
        m.add(t, f"{path}[{j}]", Removed(strict=True))
    return "\n".join(orjson.dumps(s["function"]).decode() for s in m.shown)


def call_item(names: dict[str, list], name: str | None, arguments: str) -> dict:
    """The fields of the output item for a model's call of `name`: a function call, or a custom
    tool call, with its namespace apart."""
    namespace, own, kind = names.get(name or "", (None, name, "function"))
    out: dict[str, Any] = {"type": "function_call", "name": own, "arguments": arguments}
    if kind == "custom":
        out = {"type": "custom_tool_call", "name": own, "input": custom_input(arguments)}
    elif kind == "tool_search":
        out = {"type": "tool_search_call", "execution": "client", "arguments": _object(arguments)}
    if namespace:
        out["namespace"] = namespace
    return out


def custom_input(arguments: str) -> str:
    try:
        value = orjson.loads(arguments or "")
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return value["input"]
    return arguments  # the model did not call it with one string: kept whole, not dropped


def _object(arguments: str) -> dict:
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        value = None
    # the model's arguments were not a JSON object: kept whole rather than dropped
    return value if isinstance(value, dict) else {"arguments": arguments}


def tool_choice(choice: Any, shown: list[dict] | None) -> Any:
    """The chat tool_choice; a named tool must be `shown` (None: not known yet, see `resolve`)."""
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom") and isinstance(choice.get("name"),
                                                                                               str):
        ns = choice.get("namespace")
        name = visible(ns if isinstance(ns, str) else None, choice["name"])
        if shown is not None and all(t["function"]["name"] != name for t in shown):
            raise _bad(f"{name!r} is not among the tools the model is shown", "tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    raise _bad("must be 'auto', 'none', 'required' or {'type': 'function' | 'custom', 'name': ...} (hosted tools "
               "are not served here)", "tool_choice")
