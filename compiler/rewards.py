"""Outcome and process rewards (docs/methods.md §4).

Outcome functions take (prediction text, reference) and return a float: the built-in ones are
core's harnessrl.answer_match (shared with the example harnesses). Process rewards score one
decision unit (one call's completion).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from harnessrl.compiler.response import ParsedCall
from harnessrl.errors import UserError
from harnessrl.answer_match import contains, exact_match, f1
from harnessrl.plugins import load_function

RewardFn = Callable[[str, Any], float]

OUTCOME_FUNCTIONS: dict[str, RewardFn] = {"exact_match": exact_match, "f1": f1, "contains": contains}


def load_reward_fn(spec: str) -> RewardFn:
    """A built-in name or a user `module:function`."""
    if spec in OUTCOME_FUNCTIONS:
        return OUTCOME_FUNCTIONS[spec]
    if ":" not in spec:
        raise UserError(f"unknown reward function {spec!r}: use f1, exact_match, contains or module:function")
    return load_function(spec, "reward function")


def reported_outcome(values: list[float]) -> float:
    """The outcome of a rollout with several reported outcome rewards (`values` in report order):
    the latest, as a retried or corrected grade is reported after the first. Compile counts such
    rollouts (`several_outcomes`) and says so in its notes: a harness that may report its own
    outcome can add one (a rollout whose outcome is its scorer's refuses the harness's, proxy.md#keys)."""
    return float(values[-1])


# ---- process rewards -------------------------------------------------------------------------

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "number": (int, float), "integer": (int,), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


def _type_ok(value: Any, schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if kind is None:
        return True
    kinds = kind if isinstance(kind, list) else [kind]
    for k in kinds:
        types = _JSON_TYPES.get(k)
        if types is None:
            return True  # a type we do not know: do not fail the call for it
        if isinstance(value, bool) and k in ("number", "integer"):
            continue
        if isinstance(value, types):
            return True
    return False


def call_valid(call: ParsedCall, tools: list[dict[str, Any]] | None) -> bool:
    """The call parses, the tool exists, required arguments are present, argument types match
    the schema and there are no unexpected arguments. Without tool schemas in the request
    only parsing is checked."""
    if not call.name or call.arguments is None:
        return False
    if tools is None:
        return True
    schemas = {}
    for t in tools:
        f = t.get("function", t)
        if "name" in f:
            schemas[f["name"]] = f.get("parameters") or {}
    if call.name not in schemas:
        return False
    params = schemas[call.name]
    props: dict[str, Any] = params.get("properties") or {}
    if any(k not in call.arguments for k in params.get("required") or []):
        return False
    for k, v in call.arguments.items():
        if k not in props:
            if params.get("additionalProperties") is not True:
                return False
        elif not _type_ok(v, props[k]):
            return False
    return True


def tool_format(calls: list[ParsedCall], tools: list[dict[str, Any]] | None) -> float:
    """Fraction of the unit's calls that are valid; 1.0 when the unit makes no call."""
    if not calls:
        return 1.0
    return sum(call_valid(c, tools) for c in calls) / len(calls)


def is_error_result(text: str) -> bool:
    stripped = text.strip()
    obj = None
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except ValueError:
            obj = None
    if isinstance(obj, dict) and obj.get("error"):
        return True
    return stripped.lower().startswith(("error", "exception", "traceback"))


def dispatch_ok(n_calls: int, results: list[str]) -> float:
    """Fraction of the unit's dispatched calls whose result (tool message / sub-agent answer
    seen in the next prompt) is not an error; 1.0 when the unit makes no call or no result of
    it was ever observed (the rollout ended)."""
    if n_calls == 0 or not results:
        return 1.0
    return sum(not is_error_result(r) for r in results) / len(results)


_TOOL_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.S)


def observed_results(messages: list[dict[str, Any]]) -> list[str]:
    """The tool results a harness sent after the last assistant message of a request."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    if last < 0:
        return []
    out: list[str] = []
    for m in messages[last + 1:]:
        content = m.get("content")
        if not isinstance(content, str):
            content = json.dumps(content) if content is not None else ""
        if m.get("role") == "tool":
            out.append(content)
        else:
            out.extend(_TOOL_RESPONSE.findall(content))
    return out
