"""Two-hop delegation over long, noisy tool outputs (the MATPO family), and the same tasks for one
agent (the paper's single-agent baseline).

The tasks are the two-hop ones of `multihop` ("What is the pet of the maker of the river?"), but
every tool answers with `noise` distractor rows around the true one (`river: carol` among other
items' `name: person` lines, shuffled), as MATPO's search workers read pages of results:

- `delegate=True`: the planner has only `ask_worker(question)`. It asks hop 1 ("Who is the maker
  of the river?"), the worker calls its tool, reads the noisy rows and replies the person; the
  planner then asks hop 2 ("What is the pet of carol?"), and that worker's reply is the answer.
  The planner's context holds only the workers' short replies; each worker's holds one noisy
  output (MATPO: each agent's context stays its own).
- `delegate=False`: one agent with the four tools does both hops and replies the value; its
  context holds both noisy outputs (the single-agent baseline the paper compares with).

Success is the same either way: the reply is the value and the last attribute call that ran was
the task's person with the task's attribute.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.client import HarnessRL
from harnessrl.harness_examples.chat import RolloutResult, harnessrl_client, make_client, tool_loop
from harnessrl.harness_examples.text_metrics import extract_answer
from harnessrl.harness_examples.toolbox import multihop
from harnessrl.harness_examples.toolbox.multihop import ATTRIBUTES, CONFUSE, HopTask, World, trace
from harnessrl.harness_examples.toolbox.tasks import tool_schema

NOISE = 4  # distractor rows per tool output
PLANNER_SYSTEM = "Ask the worker for the person, then ask the worker the attribute of that person."
WORKER_SYSTEM = "Call the tool, then reply the value in the row of the asked name."
SINGLE_SYSTEM = "Find the person with the relation tool, call the attribute tool with that person, reply the value."
ASK_WORKER = tool_schema("ask_worker", "question", "", compact=True)


def hop_questions(item: str, relation: str, person: str, attribute: str) -> tuple[str, str]:
    return f"Who is the {relation} of the {item}?", f"What is the {attribute} of {person}?"


def noisy(table: World, name: str, key: str, noise: int, rng: random.Random) -> str:
    """The tool output for (name, key): the true row and `noise` others, shuffled."""
    return multihop.tools(table, [], noise, rng)[f"get_{key}"](**{"item" if key in multihop.RELATIONS
                                                                     else "person": name})


@dataclass(frozen=True)
class NoisyTask:
    hop: HopTask
    delegate: bool

    @property
    def item(self) -> str:
        return self.hop.item

    @property
    def id(self) -> str:
        return self.hop.id + ("/delegate" if self.delegate else "/single")

    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": PLANNER_SYSTEM if self.delegate else SINGLE_SYSTEM},
                {"role": "user", "content": self.hop.question}]

    def episode(self, table: World, noise: int, rng: random.Random, relation: str | None = None,
                attribute: str | None = None) -> tuple[list[dict], list[dict]]:
        """(the first agent's expert trace, the workers' SFT lines) of the episode asking
        `relation` then `attribute` (the task's own by default)."""
        t = self.hop
        relation, attribute = relation or t.relation, attribute or t.attribute
        person = table[(t.item, relation)]
        value = table[(person, attribute)]
        if not self.delegate:
            rows = [(f"get_{relation}", {"item": t.item}, noisy(table, t.item, relation, noise, rng)),
                    (f"get_{attribute}", {"person": person}, noisy(table, person, attribute, noise, rng))]
            return trace(rows) + [{"role": "assistant", "content": value}], []
        q1, q2 = hop_questions(t.item, relation, person, attribute)
        workers = [worker_row(f"{self.id}/w{k}", q, name, key, table, noise, rng)
                   for k, (q, name, key) in enumerate(((q1, t.item, relation), (q2, person, attribute)))]
        return trace([("ask_worker", {"question": q1}, person), ("ask_worker", {"question": q2}, value)]), workers

    def row(self, table: World | None = None, noise: int = NOISE) -> dict[str, Any]:
        """The task's line; its expert trace over `table` with noisy outputs (without a table: the
        task's own two rows, without distractors)."""
        t = self.hop
        small = {(t.item, t.relation): t.person, (t.person, t.attribute): t.value}
        expert, _ = self.episode(table or small, noise if table else 0, random.Random(self.id))
        return {"id": self.id, "input": self.messages(), "reference": t.value,
                "expert_trace": expert, "tools": [ASK_WORKER] if self.delegate else multihop.TOOLS,
                "meta": {**t.row()["meta"], "harness": "noisy_delegate", "delegate": self.delegate}}


def worker_row(row_id: str, question: str, name: str, key: str, table: World, noise: int,
               rng: random.Random) -> dict[str, Any]:
    arg = "item" if key in multihop.RELATIONS else "person"
    rows = noisy(table, name, key, noise, rng)
    return {"id": row_id, "input": [{"role": "system", "content": WORKER_SYSTEM}, {"role": "user", "content": question}],
            "reference": table[(name, key)], "tools": multihop.TOOLS,
            "expert_trace": trace([(f"get_{key}", {arg: name}, rows)]) + [{"role": "assistant",
                                                                            "content": table[(name, key)]}],
            "meta": {"harness": "noisy_delegate-worker"}}


def generate(seed: int = 0, delegate: bool = True) -> tuple[list[NoisyTask], list[NoisyTask]]:
    train, held = multihop.generate(seed)
    return [NoisyTask(t, delegate) for t in train], [NoisyTask(t, delegate) for t in held]


write = multihop.write  # one JSON line per task's row, whatever the task


def read(path: str | Path) -> list[NoisyTask]:
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            m = r["meta"]
            hop = HopTask(r["id"].rsplit("/", 1)[0], m["item"], m["relation"], m["attribute"], m["person"],
                          r["reference"])
            out.append(NoisyTask(hop, bool(m["delegate"])))
    return out


def inconsistent_expert(tasks: list[NoisyTask], table: World, traces: int = 7, right: tuple[int, int] = (3, 5),
                        noise: int = NOISE) -> list[dict[str, Any]]:
    """SFT lines as `multihop.inconsistent_expert`'s: the first agent (planner or single agent)
    confuses the relation and the attribute on different lines; the workers' lines are faithful
    to the question they were asked (the confusion is the planner's)."""
    if not all(0 <= r <= traces for r in right):
        raise ValueError("0 ≤ right ≤ traces at each hop")
    rows = []
    for t in tasks:
        rng = random.Random(f"noisy-sft-{t.id}")
        for k in range(traces):
            relation = t.hop.relation if k < right[0] else CONFUSE[t.hop.relation]
            attribute = t.hop.attribute if (k - 1) % traces < right[1] else CONFUSE[t.hop.attribute]
            expert, workers = t.episode(table, noise, rng, relation, attribute)
            rows.append({**t.row(), "id": f"{t.id}/{k}", "expert_trace": expert})
            rows += [{**w, "id": f"{w['id']}/{k}"} for w in workers]
    return rows


def drills() -> list[dict[str, Any]]:
    """The delegating side's copy drills, in its warm start beside the toolbox's."""
    return planner_drill() + worker_drill()


def planner_drill() -> list[dict[str, Any]]:
    """SFT lines that only copy names into the planner's questions to the worker: an item into the
    hop-1 question, over every item and relation (`ask_worker("Who is the owner of the river?")` for
    "Find the owner of the river."), and the person the worker replied into the hop-2 question,
    over every person, attribute and relation (the item drawn at random, the person never the
    world's, so only copying fits it). The toolbox's copy drill teaches a name as a call's whole
    argument; the planner writes it inside a question. Measured not enough (seed 0, 4 layers): with
    the hop-1 lines alone round-1 sampled success was 0.016, with both hops and the worker drill
    the same (docs/benchmarks.md › Learning, Task families)."""
    rows = []
    for item in multihop.ITEMS:
        for relation in multihop.RELATIONS:
            question = hop_questions(item, relation, "", "")[0]
            rows.append(_drill_row(f"ask-drill-{item}-{relation}", f"Find the {relation} of the {item}.",
                                   [("ask_worker", {"question": question}, "asked")]))
    rng = random.Random("ask-drill-hop-2")
    for person in multihop.PEOPLE:
        for attribute in ATTRIBUTES:
            for relation in multihop.RELATIONS:
                item = rng.choice(multihop.ITEMS)
                q1, q2 = hop_questions(item, relation, person, attribute)
                rows.append(_drill_row(f"ask-drill-{person}-{attribute}-{relation}",
                                       f"Find the {attribute} of the {relation} of the {item}.",
                                       [("ask_worker", {"question": q1}, person),
                                        ("ask_worker", {"question": q2}, "asked")]))
    return rows


def _drill_row(row_id: str, ask: str, calls: list[tuple]) -> dict[str, Any]:
    return {"id": row_id, "reference": "", "input": [{"role": "system", "content": "Ask the worker."},
                                                     {"role": "user", "content": ask}],
            "expert_trace": trace(calls), "tools": [ASK_WORKER], "meta": {"harness": "ask-drill"}}


def worker_drill() -> list[dict[str, Any]]:
    """SFT lines that only copy the asked name into the worker's call, over every item and
    relation and every person and attribute: `get_owner(item="river")` for "Who is the owner of
    the river?". A planner that asked right was answered about another item: without this drill
    the workers called their tool on the asked name in 45 % of greedy calls (seed 0, 2 distractor
    rows). With it they did no better on the 4-layer tiny model (17 %, 4 rows), and on a 6-layer
    one they copy (83 %)."""
    rows = []
    asked = [(key, item) for key in multihop.RELATIONS for item in multihop.ITEMS]
    asked += [(key, person) for key in ATTRIBUTES for person in multihop.PEOPLE]
    for key, name in asked:
        hop1 = key in multihop.RELATIONS
        question = hop_questions(name, key, name, key)[0 if hop1 else 1]
        rows.append({"id": f"worker-drill-{key}-{name}", "reference": "",
                     "input": [{"role": "system", "content": WORKER_SYSTEM}, {"role": "user", "content": question}],
                     "expert_trace": trace([(f"get_{key}", {"item" if hop1 else "person": name}, "asked")]),
                     "tools": multihop.TOOLS, "meta": {"harness": "worker-drill"}})
    return rows


@dataclass
class NoisyConfig:
    model: str = "default"
    max_turns: int = 3
    max_tokens: int = 40
    temperature: float = 1.0
    noise: int = NOISE


def run_rollout(hrl: HarnessRL | str, table: World, task: NoisyTask, cfg: NoisyConfig | None = None, *,
                group_id: str | None = None, run: str | None = None) -> RolloutResult:
    cfg = cfg or NoisyConfig()
    rng = random.Random(f"{run}-{task.id}-{group_id}")
    tried: list[tuple[str, str]] = []
    fns = multihop.tools(table, tried, cfg.noise, rng)
    loop = dict(max_turns=cfg.max_turns, max_tokens=cfg.max_tokens, temperature=cfg.temperature)
    counts = {"tool_calls": 0, "tool_errors": 0, "worker_calls": 0}
    with harnessrl_client(hrl) as hrl_client, hrl_client.rollout(
            task_id=task.id, group_id=group_id or task.id, run=run, metadata={"harness": "noisy_delegate"}) as ro:
        if not task.delegate:
            with make_client(ro.base_url("agent"), ro.api_key("agent")) as client:
                answer, error, c = tool_loop(client, cfg.model, task.messages(), multihop.TOOLS, fns, **loop)
            counts.update(c)
        else:
            final: list[str] = []

            def ask_worker(question: str) -> str:
                counts["worker_calls"] += 1
                before = len(tried)
                messages = [{"role": "system", "content": WORKER_SYSTEM}, {"role": "user", "content": question}]
                with make_client(ro.base_url("worker"), ro.api_key("worker"),
                                 {"X-HarnessRL-Session": f"worker-{counts['worker_calls']}"}) as worker:
                    reply, _, c = tool_loop(worker, cfg.model, messages, multihop.TOOLS, fns, **loop)
                counts["tool_calls"] += c["tool_calls"]
                counts["tool_errors"] += c["tool_errors"]
                if not reply:
                    raise ValueError("the worker found no answer")
                if any(key in ATTRIBUTES for _, key in tried[before:]):
                    final.append(reply)  # a hop-2 ask: its reply is the planner's answer
                return reply

            def stop_after_answer(question: str) -> str:
                reply = ask_worker(question)
                if final:
                    raise _Answered(reply)
                return reply

            with make_client(ro.base_url("planner"), ro.api_key("planner"), {"X-HarnessRL-Session": "planner"}) as client:
                try:
                    answer, error, c = tool_loop(client, cfg.model, task.messages(), [ASK_WORKER],
                                                 {"ask_worker": stop_after_answer}, **loop)
                except _Answered as done:
                    answer, error, c = str(done), None, {"model_calls": 0}
            counts["model_calls"] = c.get("model_calls", 0)
        hop = task.hop
        person = table[(hop.item, hop.relation)]
        ran = [p for p in tried if p in table]
        last_attr = [p for p in ran if p[1] in ATTRIBUTES]
        success = float(extract_answer(answer) == table[(person, hop.attribute)] and bool(last_attr)
                         and last_attr[-1] == (person, hop.attribute))
        ro.reward(success)
        first = tried[0] if tried else None
        parts = {"right_tool": float(first is not None and first[1] == hop.relation),
                 "right_item": float(first is not None and first[0] == hop.item)}
        return RolloutResult(ro.id, task.id, success, answer, {"success": success, **parts, **counts}, error)


class _Answered(Exception):
    """The planner's hop-2 ask came back: its reply ends the planner's episode."""
