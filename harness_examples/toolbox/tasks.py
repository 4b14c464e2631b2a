"""Toolbox tasks, generated offline and deterministically from a seed.

A world of items, each with four attributes (colour, size, owner, city), one tool per attribute
(`get_color(item)`, ...). A task asks for one attribute of one item: the right tool (action) with
the item as its argument (args); the episode ends at that call, with its result as the answer
(`tool_loop(answer_from_tool=True)`). Every item appears in training with two of its attributes
and is held out with the other two, so held-out tasks are new combinations of a tool and an
argument the policy has seen, never new words.

`delegate=True`: the planner has only `ask_worker(question)`; a worker with the four tools
answers it (MATPO's planner/worker split). Rows carry the planner's expert trace; `write(...,
sft=True)` adds the worker's, for a warm start of both roles.

`compact=True` (opt-in; the learning benchmark sets it): the same tasks with a short system text
and tool schemas of only a name and a parameter: 210 prompt tokens instead of 341 for the tiny model. The tool schemas
are most of every sample's prompt, and a tiny model's SFT, rollout and training steps all cost by
the prompt's length.
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ATTRIBUTES = {
    "color": "red blue green amber violet silver".split(),
    "size": "tiny small medium large huge giant".split(),
    "owner": "alice bob carol dave erin frank".split(),
    "city": "paris oslo lima cairo delhi rome".split(),
}
ITEMS = ("river book engine ticket flight vehicle stock message file planet moon star comet piano violin "
         "guitar drum chess tennis soccer hockey gold silver copper iron carbon oxygen helium lemon mango "
         "cherry apple").split()
SYSTEM = ("Answer the question with the one tool that returns the asked attribute, called with the item; "
          "its result is your answer.")
PLANNER_SYSTEM = "You are the planner. Ask the worker the question with the ask_worker tool; its reply is your answer."
COMPACT_SYSTEM = "Call the tool of the asked attribute with the item."
COMPACT_PLANNER_SYSTEM = "Ask the worker the question."


def tool_schema(name: str, param: str, description: str, compact: bool = False) -> dict[str, Any]:
    """An OpenAI function tool of one required string parameter. `compact`: its name and parameter
    only — a call naming another tool or argument is still invalid (compiler/rewards.call_valid)."""
    if compact:
        return {"type": "function", "function": {"name": name, "parameters": {"properties": {param: {}}}}}
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {param: {"type": "string"}}, "required": [param]}}}


TOOLS = [tool_schema(f"get_{a}", "item", f"Return the {a} of an item.") for a in ATTRIBUTES]
ASK_WORKER = tool_schema("ask_worker", "question", "Ask the worker, who has the attribute tools, a question.")
COMPACT_TOOLS = [tool_schema(f"get_{a}", "item", "", compact=True) for a in ATTRIBUTES]
COMPACT_ASK_WORKER = tool_schema("ask_worker", "question", "", compact=True)


def call_trace(name: str, args: dict[str, str], result: str) -> list[dict[str, Any]]:
    """An expert trace: the call and its result, and no final reply. The episode ends at the first
    tool call that runs, so a trained answer turn would be one the policy never reaches."""
    call = {"id": "call_0", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": result}]


@dataclass(frozen=True)
class ToolboxTask:
    id: str
    item: str
    attribute: str
    value: str
    delegate: bool = False
    compact: bool = False  # the short prompt (module docstring)

    @property
    def question(self) -> str:
        return f"What is the {self.attribute} of the {self.item}?"

    def messages(self) -> list[dict[str, Any]]:
        if self.delegate:
            return [{"role": "system", "content": COMPACT_PLANNER_SYSTEM if self.compact else PLANNER_SYSTEM},
                    {"role": "user", "content": self.question}]
        return self.worker_messages()

    def worker_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": COMPACT_SYSTEM if self.compact else SYSTEM},
                {"role": "user", "content": self.question}]

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools of the task's first agent: the planner's ask_worker, or the attribute tools."""
        return ([COMPACT_ASK_WORKER] if self.compact else [ASK_WORKER]) if self.delegate else self.worker_tools

    @property
    def worker_tools(self) -> list[dict[str, Any]]:
        return COMPACT_TOOLS if self.compact else TOOLS

    def reference_call(self) -> tuple[str, dict[str, str]]:
        return ("ask_worker", {"question": self.question}) if self.delegate else (f"get_{self.attribute}",
                                                                                  {"item": self.item})

    def row(self) -> dict[str, Any]:
        name, args = self.reference_call()
        return {"id": self.id, "input": self.messages(), "reference": self.value,
                "reference_calls": [{"name": name, "arguments": args}], "expert_trace": call_trace(name, args, self.value),
                "tools": self.tools, "meta": {"harness": "toolbox", "item": self.item, "attribute": self.attribute,
                                              "delegate": self.delegate, **({"compact": True} if self.compact else {})}}

    def worker_row(self) -> dict[str, Any]:
        """The worker's part of a delegated task, as a line for SFT."""
        solo = ToolboxTask(self.id + "/worker", self.item, self.attribute, self.value, compact=self.compact)
        return {**solo.row(), "input": self.worker_messages()}


def training_world(seed: int, run_tag: str) -> dict[tuple[str, str], str]:
    """The world a training run sees: a fresh one per run tag (loop round), so that RL rewards
    calling the right tool with the right item — a remembered value (a reply without a call, or a
    wrong item that happens to share the value) never pays twice. The held-out evaluation always
    sees `world(seed)`."""
    return world(10_000 * (seed + 1) + 101 + zlib.crc32(run_tag.encode()) % 1_000_000)


def world(seed: int = 0) -> dict[tuple[str, str], str]:
    """(item, attribute) → value."""
    rng = random.Random(f"toolbox-world-{seed}")
    return {(i, a): rng.choice(vals) for i in ITEMS for a, vals in ATTRIBUTES.items()}


def generate(seed: int = 0, delegate: bool = False,
             compact: bool = False) -> tuple[list[ToolboxTask], list[ToolboxTask]]:
    """(training, held-out) tasks: 64 each, every item with two attributes on each side;
    `compact`: with the short prompt (the same tasks otherwise)."""
    table = world(seed)
    rng = random.Random(f"toolbox-split-{seed}")
    train, held = [], []
    for item in ITEMS:
        attrs = list(ATTRIBUTES)
        rng.shuffle(attrs)
        for side, chosen in ((train, attrs[:2]), (held, attrs[2:])):
            for a in chosen:
                side.append(ToolboxTask(f"toolbox-{item}-{a}", item, a, table[(item, a)], delegate, compact))
    rng.shuffle(train)
    rng.shuffle(held)
    return train, held


def write(tasks: list[ToolboxTask], path: str | Path, sft: bool = False) -> Path:
    """Tasks JSONL (`harnessrl tasks import` format); `sft=True` adds the workers' lines of delegated tasks."""
    path = Path(path)
    rows = [t.row() for t in tasks] + ([t.worker_row() for t in tasks if t.delegate] if sft else [])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def inconsistent_expert(tasks: list[ToolboxTask], table: dict[tuple[str, str], str], confusions: dict[str, str],
                        traces: int = 3, right: int = 1) -> list[dict[str, Any]]:
    """SFT lines of an expert that mixes up tools: `traces` lines per task; for a task asking an
    attribute in `confusions` (asked → called), `right` of them call the asked attribute's tool
    and the others the confused one's (its result that attribute's value, so the line is a real
    episode); every other task's lines call the right tool. With the same task both ways in the
    data, a model fitted on it keeps the mix as its policy for that question (it cannot remember
    which one a task had), so its greedy choice is the confused tool and its sampled one is right
    `right/traces` of the time. Delegated tasks: the worker's lines carry the mix."""
    unknown = [a for pair in confusions.items() for a in pair if a not in ATTRIBUTES]
    if unknown or not 0 <= right <= traces:
        raise ValueError(f"confusions must map attributes to attributes ({unknown}) and 0 ≤ right ≤ traces")
    rows = []
    for t in tasks:
        solo = ToolboxTask(t.id + "/worker" if t.delegate else t.id, t.item, t.attribute, t.value, compact=t.compact)
        for k in range(traces):
            called = confusions.get(t.attribute, t.attribute) if k >= right else t.attribute
            rows.append({**solo.row(), "expert_trace": call_trace(f"get_{called}", {"item": t.item},
                                                                   table[(t.item, called)])})
        if t.delegate:
            rows.append(t.row())
    return rows


def copy_drill(items: list[str] | None = None, compact: bool = False) -> list[dict[str, Any]]:
    """SFT lines that only copy a name into a call's argument: `find(item)` for each item, asked
    two ways. A pretrained LLM brings this skill; the tiny model does not, and without it the
    toolbox warm start writes an item remembered with the tool instead of the question's (on
    held-out combinations almost never the right one), a failure no tool choice can mend.
    `compact`: its tool schema as short as the compact tasks'."""
    find = tool_schema("find", "item", "Find an item.", compact)
    rows = []
    for item in items or ITEMS:
        for k, question in enumerate((f"Find the {item}.", f"Where is the {item}?")):
            rows.append({"id": f"copy-{item}-{k}", "input": [{"role": "system", "content": "Call find with the item."},
                                                             {"role": "user", "content": question}],
                         "reference": "found", "expert_trace": call_trace("find", {"item": item}, "found"),
                         "tools": [find], "meta": {"harness": "copy-drill", "item": item}})
    return rows


def read(path: str | Path) -> list[ToolboxTask]:
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            m = r["meta"]
            out.append(ToolboxTask(r["id"], m["item"], m["attribute"], r["reference"], bool(m.get("delegate")),
                                   bool(m.get("compact"))))
    return out
