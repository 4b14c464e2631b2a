"""Outcome and process rewards (METHODS §4).

Outcome functions take (prediction text, reference) and return a float; a reference may be a
string or a list of acceptable strings (the best match counts). Process rewards score one
decision unit (one call's completion).
"""

from __future__ import annotations

import importlib
import json
import re
import string
from collections import Counter
from collections.abc import Callable
from typing import Any

from harnessrl.compiler.response import ParsedCall
from harnessrl.errors import UserError

RewardFn = Callable[[str, Any], float]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _refs(reference: Any) -> list[str]:
    if reference is None:
        return []
    if isinstance(reference, (list, tuple)):
        return [str(r) for r in reference]
    if isinstance(reference, dict) and "answer" in reference:
        return _refs(reference["answer"])
    return [str(reference)]


def _f1_one(pred: str, ref: str) -> float:
    p, r = normalize_answer(pred).split(), normalize_answer(ref).split()
    common = sum((Counter(p) & Counter(r)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(r)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, reference: Any) -> float:
    return max((float(normalize_answer(prediction) == normalize_answer(r)) for r in _refs(reference)), default=0.0)


def f1(prediction: str, reference: Any) -> float:
    """Token-level F1 after SQuAD normalisation."""
    return max((_f1_one(prediction, r) for r in _refs(reference)), default=0.0)


def contains(prediction: str, reference: Any) -> float:
    """ToolHop AC: 1 if the normalised reference occurs in the normalised prediction."""
    pred = normalize_answer(prediction)
    return max((float(bool(normalize_answer(r)) and normalize_answer(r) in pred) for r in _refs(reference)),
               default=0.0)


OUTCOME_FUNCTIONS: dict[str, RewardFn] = {"exact_match": exact_match, "f1": f1, "contains": contains}


def load_reward_fn(spec: str) -> RewardFn:
    """A built-in name or a user `module:function`."""
    if spec in OUTCOME_FUNCTIONS:
        return OUTCOME_FUNCTIONS[spec]
    if ":" not in spec:
        raise UserError(f"unknown reward function {spec!r}: use f1, exact_match, contains or module:function")
    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"cannot load reward function {spec!r}: {exc}") from None
    if not callable(fn):
        raise UserError(f"reward function {spec!r} is not callable")
    return fn


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
