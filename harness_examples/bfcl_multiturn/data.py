"""BFCL multi-turn tasks from the installed `bfcl-eval` package: the questions, ground-truth
call sequences, tool docs (as OpenAI tool schemas) and the executable back-ends, plus BFCL's
state check and the export of tasks (reference calls, expert traces) for `harnessrl tasks import`.

`bfcl-eval` is installed without its dependencies (`pip install --no-deps`); of them, the
back-ends used here need only `mpmath` (MathAPI), which comes with torch's sympy.
Ground-truth calls are parsed with `ast` (literal arguments only) and run on the back-end
objects directly; nothing goes through `eval`.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from harnessrl.errors import UserError

BFCL_VERSION = "2026.3.23"
CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
# The user turn BFCL inserts when held-out functions become available (its FC-mode wording).
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
_BACKENDS = {
    "GorillaFileSystem": ("gorilla_file_system", "gorilla_file_system.json"),
    "MathAPI": ("math_api", "math_api.json"),
    "MessageAPI": ("message_api", "message_api.json"),
    "TwitterAPI": ("posting_api", "posting_api.json"),
    "TicketAPI": ("ticket_api", "ticket_api.json"),
    "TradingBot": ("trading_bot", "trading_bot.json"),
    "TravelAPI": ("travel_booking", "travel_booking.json"),
    "VehicleControlAPI": ("vehicle_control", "vehicle_control.json"),
}
_STATELESS = {"MathAPI"}
_TYPES = {"dict": "object", "float": "number", "tuple": "array"}


def _package():
    try:
        return resources.files("bfcl_eval")
    except ModuleNotFoundError:
        raise UserError(f"bfcl-eval is not installed: pip install --no-deps bfcl-eval=={BFCL_VERSION}") from None


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@dataclass
class BfclTask:
    id: str
    turns: list[list[dict]]  # the user messages of each turn
    initial_config: dict
    involved_classes: list[str]
    ground_truth: list[list[str]]  # per turn, calls like "mv(source='a', destination='b')"
    excluded_functions: list[str] = field(default_factory=list)
    missed_functions: dict[int, list[str]] = field(default_factory=dict)  # turn -> functions revealed there

    @property
    def long_context(self) -> bool:
        return "long_context" in self.id

    def user_messages(self, turn: int) -> list[dict]:
        if not self.turns[turn] and turn in self.missed_functions:
            return [{"role": "user", "content": ADDED_FUNCTIONS_PROMPT}]
        return self.turns[turn]


def load_tasks(category: str = "multi_turn_base", ids: list[str] | None = None, limit: int | None = None) -> list[BfclTask]:
    if category not in CATEGORIES:
        raise UserError(f"unknown BFCL category {category!r}; choose from {', '.join(CATEGORIES)}")
    data = _package() / "data"
    questions = _jsonl(data / f"BFCL_v4_{category}.json")
    answers = {row["id"]: row["ground_truth"] for row in _jsonl(data / "possible_answer" / f"BFCL_v4_{category}.json")}
    tasks = [
        BfclTask(q["id"], q["question"], q.get("initial_config", {}), q["involved_classes"], answers[q["id"]],
                 q.get("excluded_function", []), {int(k): v for k, v in q.get("missed_function", {}).items()})
        for q in questions
        if set(q["involved_classes"]) <= set(_BACKENDS)
    ]
    if ids is not None:
        by_id = {t.id: t for t in tasks}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise UserError(f"no BFCL task {missing[0]!r} in {category}")
        tasks = [by_id[i] for i in ids]
    return tasks[:limit] if limit is not None else tasks


def function_docs(task: BfclTask, turn: int) -> list[dict]:
    """The BFCL function docs the agent may call at `turn` (excluded and not-yet-revealed ones removed)."""
    hidden = set(task.excluded_functions)
    hidden |= {f for t, fs in task.missed_functions.items() if t > turn for f in fs}
    docs = []
    for cls in task.involved_classes:
        for doc in _func_docs(cls):
            if doc["name"] not in hidden:
                docs.append(doc)
    return docs


def _func_docs(cls: str) -> list[dict]:
    return _jsonl(_package() / "data" / "multi_turn_func_doc" / _BACKENDS[cls][1])


def _schema(node: Any) -> Any:
    """BFCL's JSON-schema dialect (dict, float, tuple, any) → standard JSON schema."""
    if isinstance(node, dict):
        out = {k: _schema(v) for k, v in node.items() if k != "response"}
        if node.get("type") == "any":
            out.pop("type")
        elif isinstance(node.get("type"), str):
            out["type"] = _TYPES.get(node["type"], node["type"])
        if "properties" in node:
            out["properties"] = {name: _schema(p) for name, p in node["properties"].items()}
        return out
    if isinstance(node, list):
        return [_schema(v) for v in node]
    return node


def openai_tools(docs: list[dict]) -> list[dict]:
    return [{"type": "function", "function": {"name": d["name"], "description": d["description"],
                                               "parameters": _schema(d["parameters"])}} for d in docs]


def parse_call(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """`name(arg, key=value)` with literal arguments → (name, args, kwargs)."""
    node = ast.parse(text.strip(), mode="eval").body
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise ValueError(f"not a function call: {text!r}")
    return (node.func.id, [ast.literal_eval(a) for a in node.args],
            {k.arg: ast.literal_eval(k.value) for k in node.keywords})


def _result_text(value: Any) -> str:
    # BFCL's rendering of a result: strings as they are, dicts as JSON, the rest with str().
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class Backends:
    """Fresh instances of a task's back-end classes, loaded with its initial configuration."""

    def __init__(self, task: BfclTask) -> None:
        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}
        prefix = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code."
        for cls in task.involved_classes:
            instance = getattr(importlib.import_module(prefix + _BACKENDS[cls][0]), cls)()
            if cls not in _STATELESS:
                instance._load_scenario(copy.deepcopy(task.initial_config.get(cls, {})), long_context=task.long_context)
            self.instances[cls] = instance
            for name, method in inspect.getmembers(instance, inspect.ismethod):
                if not name.startswith("_"):
                    self.methods[name] = method

    def call(self, name: str, args: list[Any] | None = None, kwargs: dict[str, Any] | None = None) -> tuple[str, bool]:
        """Run one call; (BFCL-rendered result, ok). Failures come back as text, as BFCL does."""
        method = self.methods.get(name)
        if method is None:
            return f"Error during execution: no function named {name!r}", False
        try:
            value = method(*(args or []), **(kwargs or {}))
        except Exception as exc:  # the back-ends raise anything on bad input; the model must see it
            return f"Error during execution: {exc}", False
        ok = not (isinstance(value, dict) and "error" in value)
        return _result_text(value), ok

    def run(self, text: str) -> str:
        name, args, kwargs = parse_call(text)
        return self.call(name, args, kwargs)[0]

    def named_arguments(self, text: str) -> tuple[str, dict[str, Any]]:
        """A ground-truth call with its positional arguments given their parameter names."""
        name, args, kwargs = parse_call(text)
        bound = inspect.signature(self.methods[name]).bind(*args, **kwargs)
        return name, dict(bound.arguments)


def state_check(agent: Backends, truth: Backends) -> tuple[bool, dict]:
    """BFCL's state check: every public attribute of every back-end equals the ground truth's."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import state_checker

    result = state_checker(agent.instances, truth.instances)
    return result["valid"], result.get("details", {}).get("differences", {})


def reference_calls(task: BfclTask) -> list[dict]:
    """The ground-truth calls of all turns, in order, as `{name, arguments}` (MatchTIR's G)."""
    backends = Backends(task)
    calls = []
    for turn in task.ground_truth:
        for text in turn:
            name, arguments = backends.named_arguments(text)
            calls.append({"name": name, "arguments": arguments})
    return calls


def expert_trace(task: BfclTask) -> list[dict]:
    """The ground truth as chat messages: per turn the user message(s), then one assistant tool
    call per ground-truth call, each followed by its executed result."""
    backends = Backends(task)
    messages: list[dict] = []
    n = 0
    for turn, calls in enumerate(task.ground_truth):
        messages += task.user_messages(turn)
        for text in calls:
            name, arguments = backends.named_arguments(text)
            call_id = f"call_{n}"
            n += 1
            messages.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]})
            messages.append({"role": "tool", "tool_call_id": call_id, "content": backends.run(text)})
    return messages


def export_tasks(tasks: list[BfclTask], path: str | Path) -> int:
    """Write `harnessrl tasks import` JSONL: id, input (all user turns), reference calls, expert trace."""
    with open(path, "w", encoding="utf-8") as f:
        for t in tasks:
            row = {"id": t.id, "input": [m for i in range(len(t.turns)) for m in t.user_messages(i)],
                   "reference": None, "reference_calls": reference_calls(t), "expert_trace": expert_trace(t),
                   "meta": {"benchmark": "bfcl", "involved_classes": t.involved_classes, "turns": len(t.turns)}}
            f.write(json.dumps(row) + "\n")
    return len(tasks)
