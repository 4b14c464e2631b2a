"""BFCL's single-turn AST categories from the installed `bfcl-eval`: each entry's question, its
function docs (as BFCL ships them, for the checker; as OpenAI tools, for the model) and its
possible answers; the train / held-out split by id; the tasks a run uses; the tasks file.

The split is a property of the id alone (a hash), so it is the same for every seed, run and
machine, and no selection of training tasks can ever include a held-out id.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from harnessrl.errors import UserError
from harnessrl.harness_examples.bfcl_single.bfcl_imports import BFCL_VERSION, bfcl

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple")
# No call passes BFCL's checker on these: their possible answer gives a required argument no
# accepted value (or none at all), or requires one the function does not have. Kept, as BFCL's
# leaderboard keeps them: they score 0 for every model.
UNANSWERABLE = frozenset({"live_simple_106-63-0", "live_simple_112-68-0", "live_multiple_507-149-4",
                          "live_multiple_862-181-3", "live_multiple_964-207-0"})
HELD_OUT_BUCKETS = 5  # one id in five (by hash) is held out: ~460 of the 2,310 entries


@dataclass(frozen=True)
class BfclSingleTask:
    id: str
    category: str
    messages: list[dict]  # BFCL's question: the chat messages of its one turn (live ones may hold a system message)
    functions: list[dict]  # the function docs as shipped (BFCL's types: dict, float, tuple, any)
    possible_answer: list[dict]  # [{func_name: {arg: [accepted values, "" = may be omitted]}}]


def _id_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def is_held_out(task_id: str) -> bool:
    return _id_hash(task_id) % HELD_OUT_BUCKETS == 0


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@cache
def _category(category: str) -> tuple[BfclSingleTask, ...]:
    try:
        data = resources.files("bfcl_eval") / "data"
    except ModuleNotFoundError:
        raise UserError(f"bfcl-eval is not installed: pip install --no-deps bfcl-eval=={BFCL_VERSION}") from None
    answers = {r["id"]: r["ground_truth"] for r in _jsonl(data / "possible_answer" / f"BFCL_v4_{category}.json")}
    return tuple(BfclSingleTask(q["id"], category, q["question"][0], q["function"], answers[q["id"]])
                 for q in _jsonl(data / f"BFCL_v4_{category}.json"))


def load_tasks(categories: tuple[str, ...] | list[str] = CATEGORIES) -> list[BfclSingleTask]:
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise UserError(f"unknown BFCL category {unknown[0]!r}; choose from {', '.join(CATEGORIES)}")
    return [t for c in categories for t in _category(c)]


def split(tasks: list[BfclSingleTask]) -> tuple[list[BfclSingleTask], list[BfclSingleTask]]:
    """(training side, held-out side) by id."""
    return [t for t in tasks if not is_held_out(t.id)], [t for t in tasks if is_held_out(t.id)]


def _balanced(tasks: list[BfclSingleTask], n: int, key) -> list[BfclSingleTask]:
    """n tasks taken from the categories in turn (each ordered by `key`), so a few tasks still cover
    every category."""
    queues = {}
    for t in sorted(tasks, key=key):
        queues.setdefault(t.category, []).append(t)
    order = [c for c in CATEGORIES if c in queues]
    out: list[BfclSingleTask] = []
    while len(out) < n:
        for c in order:
            if queues[c] and len(out) < n:
                out.append(queues[c].pop(0))
    return out


def choose(pool: list[BfclSingleTask], n_tasks: int, eval_fraction: float,
           seed: int) -> tuple[list[BfclSingleTask], list[BfclSingleTask]]:
    """The loop's `--n-tasks` tasks, `--eval-fraction` of them held-out ones. Training tasks are a
    seeded draw from the training side; held-out ones the same for every seed, so evaluations of
    runs with different seeds score the same tasks."""
    if n_tasks < 2 or not 0 < eval_fraction < 1:
        raise UserError(f"--n-tasks {n_tasks} with --eval-fraction {eval_fraction}: bfcl_single needs at least 2 "
                        "tasks and a fraction between 0 and 1 (one to train, one held out)")
    n_eval = min(max(1, round(n_tasks * eval_fraction)), n_tasks - 1)
    train_side, held_side = split(pool)
    if n_tasks - n_eval > len(train_side) or n_eval > len(held_side):
        raise UserError(f"--n-tasks {n_tasks} with --eval-fraction {eval_fraction}: bfcl_single's tasks here hold "
                        f"{len(train_side)} training and {len(held_side)} held-out ids")
    train = _balanced(train_side, n_tasks - n_eval, lambda t: _id_hash(f"{seed}:{t.id}"))
    return train, _balanced(held_side, n_eval, _held_order)


def _held_order(task: BfclSingleTask) -> int:
    return _id_hash(task.id)


def held_out(categories: tuple[str, ...] | list[str] = CATEGORIES,
             per_category: int | None = None) -> list[BfclSingleTask]:
    """Each category's held-out entries in their fixed order (the order `choose` takes them in),
    the first `per_category` of each: what bench/bfcl_accuracy.py scores."""
    return [t for c in categories for t in sorted(split(load_tasks([c]))[1], key=_held_order)[:per_category]]


def read_selection(path: Path) -> list[BfclSingleTask]:
    """`--tasks FILE`: BFCL category names or task ids, one a line; the pool tasks are chosen from."""
    lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    by_id = {t.id: t for t in load_tasks()}
    pool: dict[str, BfclSingleTask] = {}
    for line in lines:
        found = load_tasks([line]) if line in CATEGORIES else [by_id[line]] if line in by_id else None
        if found is None:
            raise UserError(f"{path}: {line!r} is neither a BFCL category ({', '.join(CATEGORIES)}) nor a task id")
        pool.update((t.id, t) for t in found)
    return list(pool.values())


def openai_tools(task: BfclSingleTask) -> list[dict]:
    """The function docs as BFCL's OpenAI function-calling handler sends them: its Python hint
    appended to each description, then its `convert_to_tool` ("." in names → "_", BFCL types →
    JSON schema)."""
    b = bfcl()
    entry = b.add_hint([{"id": task.id, "function": copy.deepcopy(task.functions)}])[0]
    return b.convert_to_tool(entry["function"])


def reference_calls(task: BfclSingleTask) -> list[dict]:
    """The first accepted answer as calls the model could make: tool names as the model sees them,
    each argument's first accepted value; an optional argument whose first accepted value is ""
    (may be omitted) is left out, a required one takes its first real value (a few BFCL answers
    list "" first for a required argument), and one the function does not have is left out.
    The five UNANSWERABLE entries have no answer the checker accepts."""
    docs = {f["name"]: f for f in task.functions}
    calls = []
    for answer in task.possible_answer:
        (name, params), = answer.items()
        schema = docs.get(name, {}).get("parameters", {})
        required, known = set(schema.get("required", [])), set(schema.get("properties", {}))
        args = {}
        for key, accepted in params.items():
            real = [v for v in accepted if v != ""]
            if real and key in known and (key in required or accepted[0] != ""):
                args[key] = _concrete(real[0])
        calls.append({"name": name.replace(".", "_"), "arguments": args})
    return calls


def _concrete(value: Any) -> Any:
    # A dict argument's answer nests once (BFCL's dict_checker): each key has its accepted values,
    # literals; a list of dicts is a list of such dicts.
    def first(accepted: dict[str, list]) -> dict[str, Any]:
        return {k: vs[0] for k, vs in accepted.items() if vs and vs[0] != ""}

    if isinstance(value, dict):
        return first(value)
    if isinstance(value, list) and value and all(isinstance(d, dict) for d in value):
        return [first(d) for d in value]
    return value


def expert_trace(task: BfclSingleTask) -> list[dict]:
    """The question, then one assistant turn with the reference calls (nothing runs after them)."""
    calls = [{"id": f"call_{i}", "type": "function",
              "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
             for i, c in enumerate(reference_calls(task))]
    return [*task.messages, {"role": "assistant", "content": "", "tool_calls": calls}]


def write(tasks: list[BfclSingleTask], path: str | Path) -> Path:
    """`harnessrl tasks import` JSONL: the question, reference calls, expert trace and the tools."""
    path = Path(path)
    path.write_text("".join(json.dumps({
        "id": t.id, "input": t.messages, "reference": None, "reference_calls": reference_calls(t),
        "expert_trace": expert_trace(t), "tools": openai_tools(t),
        "meta": {"benchmark": "bfcl", "category": t.category, "held_out": is_held_out(t.id)}}) + "\n" for t in tasks))
    return path
