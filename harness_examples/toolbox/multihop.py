"""Two-hop toolbox tasks (the CAPO family): Harness-RL's multi-hop retrieval, where every
decision is a tool (action) and its arguments, and the first decision decides what the second
can find.

A world of items and people. Hop 1 asks a relation of an item, `get_owner(item)` or
`get_maker(item)`, which returns a person; hop 2 asks an attribute of that person, `get_city(person)`
or `get_pet(person)`. "What is the pet of the maker of the river?" is right only as
`get_maker(river)` then `get_pet(<its result>)`: the second call's argument is the first call's
result, so a wrong first tool sends the second call to the wrong person (the action and args
interfere across decisions), and the episode ends at the first hop-2 call that runs, its result
being the answer. The harness posts a decision-level process reward on each call
(`decision_right`, named `decision`): right tool and arguments given what the episode had found,
so each decision is scored on its own whatever the outcome (Harness-RL combines such rewards with
the outcome; CAPO's `harness` advantage reads them beside `tool_format` and `dispatch_ok`). Item
tools refuse a person and person tools an item, so `dispatch_ok` fails a call that copied the
wrong kind of name.

Every item is in training with two of its four (relation, attribute) questions and held out with
the other two: new combinations of seen words. The warm start imitates an expert that confuses
the relation (owner ↔ maker) and the attribute (city ↔ pet), each right on some of a task's
lines (`inconsistent_expert`), so the sampled policy is unsure at both decisions. Its relation is
wrong on most of a task's lines, so the question's relation word tells which tool it calls (the
other one): a policy that ignores the word cannot fit it. Right on 3 lines of 7, the expert called
`get_maker` on 3 of 7 lines for a maker question and 4 of 7 for an owner one, the tiny model's warm
start ignored the word, and one round of RL flipped its one question-blind call.
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.client import HarnessRL
from harnessrl.harness_examples.chat import (EpisodeStopped, RolloutResult, chat, harnessrl_client, make_client,
                                             resolve_model, run_tool, tool_message)
from harnessrl.harness_examples.toolbox.tasks import ITEMS, tool_schema

RELATIONS = ("owner", "maker")  # hop 1: item → person
ATTRIBUTES = {"city": "paris oslo lima cairo delhi rome".split(),  # hop 2: person → value
              "pet": "cat dog fish bird horse mouse".split()}
PEOPLE = "alice bob carol dave erin frank grace heidi ivan judy oscar peggy".split()
CONFUSE = {"owner": "maker", "maker": "owner", "city": "pet", "pet": "city"}
SYSTEM = "Find the person with the relation tool, then call the attribute tool with that person."
TOOLS = ([tool_schema(f"get_{r}", "item", "", compact=True) for r in RELATIONS]
         + [tool_schema(f"get_{a}", "person", "", compact=True) for a in ATTRIBUTES])

World = dict[tuple[str, str], str]  # (item, relation) → person and (person, attribute) → value


def world(seed: int = 0) -> World:
    rng = random.Random(f"multihop-world-{seed}")
    table = {(i, r): rng.choice(PEOPLE) for i in ITEMS for r in RELATIONS}
    table.update({(p, a): rng.choice(vals) for p in PEOPLE for a, vals in ATTRIBUTES.items()})
    return table


def training_world(seed: int, run_tag: str) -> World:
    """A fresh world per training round (as the toolbox's): a remembered person or value never pays."""
    return world(10_000 * (seed + 1) + 303 + zlib.crc32(run_tag.encode()) % 1_000_000)


@dataclass(frozen=True)
class HopTask:
    id: str
    item: str
    relation: str
    attribute: str
    person: str  # in the seed's world
    value: str

    @property
    def question(self) -> str:
        return f"What is the {self.attribute} of the {self.relation} of the {self.item}?"

    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": self.question}]

    def calls(self, table: World, relation: str | None = None, attribute: str | None = None) -> list[tuple]:
        """The two calls (name, args, result) of the episode that asks `relation` then `attribute`."""
        relation, attribute = relation or self.relation, attribute or self.attribute
        person = table[(self.item, relation)]
        return [(f"get_{relation}", {"item": self.item}, person),
                (f"get_{attribute}", {"person": person}, table[(person, attribute)])]

    def row(self, trace_calls: list[tuple] | None = None) -> dict[str, Any]:
        calls = trace_calls or [(n, a, r) for n, a, r in self.calls({(self.item, self.relation): self.person,
                                                                       (self.person, self.attribute): self.value})]
        return {"id": self.id, "input": self.messages(), "reference": self.value,
                "reference_calls": [{"name": n, "arguments": a} for n, a, _ in calls[:2]],
                "expert_trace": trace(calls), "tools": TOOLS,
                "meta": {"harness": "multihop", "item": self.item, "relation": self.relation,
                         "attribute": self.attribute, "person": self.person}}


def trace(calls: list[tuple]) -> list[dict[str, Any]]:
    """An expert trace of consecutive calls, each with its result, and no final reply (the
    episode ends at the last call)."""
    out = []
    for k, (name, args, result) in enumerate(calls):
        call = {"id": f"call_{k}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        out += [{"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"call_{k}", "content": result}]
    return out


def generate(seed: int = 0) -> tuple[list[HopTask], list[HopTask]]:
    """(training, held-out): 64 each, every item with two of its four questions on each side."""
    table = world(seed)
    rng = random.Random(f"multihop-split-{seed}")
    train, held = [], []
    for item in ITEMS:
        combos = [(r, a) for r in RELATIONS for a in ATTRIBUTES]
        rng.shuffle(combos)
        for side, chosen in ((train, combos[:2]), (held, combos[2:])):
            for r, a in chosen:
                person = table[(item, r)]
                side.append(HopTask(f"multihop-{item}-{r}-{a}", item, r, a, person, table[(person, a)]))
    rng.shuffle(train)
    rng.shuffle(held)
    return train, held


def write(tasks: list[HopTask], path: str | Path) -> Path:
    path = Path(path)
    path.write_text("".join(json.dumps(t.row()) + "\n" for t in tasks))
    return path


def read(path: str | Path) -> list[HopTask]:
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            m = r["meta"]
            out.append(HopTask(r["id"], m["item"], m["relation"], m["attribute"], m["person"], r["reference"]))
    return out


def inconsistent_expert(tasks: list[HopTask], table: World, traces: int = 7,
                        right: tuple[int, int] = (2, 5)) -> list[dict[str, Any]]:
    """SFT lines: `traces` per task; the relation right on the first `right[0]` lines, the
    attribute on `right[1]` lines from the second on (defaults 2 and 5 of 7: greedy takes the
    question's other relation, 5 lines to 2, and the right attribute; the line right at both hops
    is the second); every line a real episode of the world (the confused relation's person, the
    confused attribute's value)."""
    if not all(0 <= r <= traces for r in right):
        raise ValueError("0 ≤ right ≤ traces at each hop")
    rows = []
    for t in tasks:
        for k in range(traces):
            relation = t.relation if k < right[0] else CONFUSE[t.relation]
            attribute = t.attribute if (k - 1) % traces < right[1] else CONFUSE[t.attribute]
            rows.append(t.row(t.calls(table, relation, attribute)))
    return rows


def tools(table: World, tried: list[tuple[str, str]], noise: int = 0, rng: random.Random | None = None) -> dict:
    """The four tools over `table`; each call appends its (name, key) to `tried`. `noise` > 0:
    each result is that many distractor rows of other names around the true one, `name: result`
    lines in a shuffled order (the MATPO family's long, noisy tool outputs)."""
    def tool(key: str, kind: str, names: list[str]):
        def get(**kwargs: str) -> str:
            name = kwargs.get(kind)
            if name is None or len(kwargs) != 1:
                raise ValueError(f"give the {kind}")
            tried.append((name, key))
            if (name, key) not in table:
                raise ValueError(f"no {kind} {name!r}")
            if not noise:
                return table[(name, key)]
            others = (rng or random.Random(0)).sample([n for n in names if n != name], noise)
            rows = [f"{n}: {table[(n, key)]}" for n in [name, *others]]
            (rng or random.Random(0)).shuffle(rows)
            return "\n".join(rows)
        return get

    return {**{f"get_{r}": tool(r, "item", list(ITEMS)) for r in RELATIONS},
            **{f"get_{a}": tool(a, "person", PEOPLE) for a in ATTRIBUTES}}


def decision_right(task: HopTask, name: str, args: dict | None, found: str | None) -> float:
    """The decision-level process reward (Harness-RL's, posted by the harness on the call): a
    relation call is right when it is the task's relation of the task's item; an attribute call
    when it is the task's attribute of the person the last relation call found — right given
    what the first decision found, so each decision is credited for its own tool and arguments."""
    args = args or {}
    if name[4:] in RELATIONS:
        return float(name == f"get_{task.relation}" and args == {"item": task.item})
    return float(name == f"get_{task.attribute}" and found is not None and args == {"person": found})


@dataclass
class MultihopConfig:
    model: str = "default"
    max_turns: int = 3
    max_tokens: int = 40
    temperature: float = 1.0


def run_rollout(hrl: HarnessRL | str, table: World, task: HopTask, cfg: MultihopConfig | None = None, *,
                group_id: str | None = None, run: str | None = None) -> RolloutResult:
    """One episode: calls run until the first attribute (hop-2) call that runs, whose result is
    the answer; success is that call being `get_<attribute>` of the task's person in `table`."""
    cfg = cfg or MultihopConfig()
    tried: list[tuple[str, str]] = []
    fns = tools(table, tried)
    counts = {"tool_calls": 0, "tool_errors": 0, "model_calls": 0}
    answer, error = "", None
    with harnessrl_client(hrl) as hrl_client, hrl_client.rollout(
            task_id=task.id, group_id=group_id or task.id, run=run, metadata={"harness": "multihop"}) as ro:
        with make_client(ro.base_url("agent"), ro.api_key("agent")) as client:
            messages = task.messages()
            found = None  # the person the last relation call that ran returned
            try:
                model = resolve_model(client, cfg.model)
                for _ in range(cfg.max_turns):
                    counts["model_calls"] += 1
                    turn = chat(client, model, messages, TOOLS, max_tokens=cfg.max_tokens, temperature=cfg.temperature)
                    messages.append(turn.message)
                    if not turn.tool_calls:
                        break
                    call = turn.tool_calls[0]  # one decision per turn: the first call runs
                    result, ok = run_tool(call, fns)
                    counts["tool_calls"] += 1
                    counts["tool_errors"] += not ok
                    messages.append(tool_message(call, result))
                    if turn.call_id:
                        ro.process_reward(turn.call_id, decision_right(task, call.name, call.arguments, found),
                                          name="decision")
                    if ok and call.name[4:] in RELATIONS:
                        found = result
                    if ok and call.name[4:] in ATTRIBUTES:
                        answer = result
                        break
            except EpisodeStopped as exc:
                error = str(exc)
        person = table[(task.item, task.relation)]
        ran = [p for p in tried if p in table]
        success = float(bool(ran) and ran[-1] == (person, task.attribute) and answer == table[ran[-1]])
        ro.reward(success)
        first = tried[0] if tried else None
        parts = {"right_tool": float(first is not None and first[1] == task.relation),
                 "right_item": float(first is not None and first[0] == task.item),
                 "right_hop2": float(any(p == (person, task.attribute) for p in tried))}
        return RolloutResult(ro.id, task.id, success, answer, {"success": success, **parts, **counts}, error)
