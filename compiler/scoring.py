"""Stage 2 of `harnessrl compile`: rewards attached to rollouts and decision units (docs/methods.md §4).

Outcome: the harness-reported one (the latest report wins) or a named function of the central
agent's final answer; a rollout with neither has `has_outcome = False` (the pipeline leaves it
out or scores it 0, `--missing-outcome`). Process rewards per unit: reported ones, and the
computed `tool_format`, `dispatch_ok` and `matchtir`. Each unit also gets its call counts
(`calls_valid` of `calls_attempted`, validated against the request's `tools` schema) when an
estimator or `tool_format` needs them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import select

from harnessrl.compiler.matchtir import call_rewards, reference_calls, turn_rewards
from harnessrl.compiler.reader import Reader, RolloutWork, Unit
from harnessrl.compiler.rewards import (RewardFn, call_valid, dispatch_ok, f1, observed_results, reported_outcome,
                                        tool_format)
from harnessrl.records import Reward


def trained(w: RolloutWork, agent: str | None, scope: str) -> bool:
    """Is `agent` trained under `--train-agents` (central | all | comma-separated names)?"""
    if scope == "all":
        return True
    if scope == "central":
        return agent == w.central
    return agent in {a.strip() for a in scope.split(",")}


def turns(w: RolloutWork, scope: str) -> list[Unit]:
    """The rollout's decision units of the trained agents in seq order (MatchTIR's turns)."""
    return sorted((u for u in w.units.values() if trained(w, u.call.agent, scope)), key=lambda u: u.call.seq)


def final_answer(w: RolloutWork) -> str | None:
    central = [u for u in w.units.values() if u.call.agent == w.central]
    return max(central, key=lambda u: u.call.seq).parse().answer if central else None


def result_call(u: Unit) -> str | None:
    """The call whose prompt shows the results of u's calls: u's first child in the prefix tree,
    else the session's next call in seq order that starts a new root (the harness compressed or
    re-rendered the history after the results came in); None if the session ended."""
    tree = u.tree
    node = tree.nodes[u.node]
    if node.children:
        return tree.nodes[node.children[0]].call.call_id
    for later in tree.nodes[u.node + 1:]:  # nodes are in seq order
        if later.parent < 0 and later.cause in ("drift", "rewrite"):
            return later.call.call_id
    return None


class Scorer:
    def __init__(self, reader: Reader, tasks: dict[str, dict[str, Any]], reward_fn: RewardFn | None,
                 process: tuple[str, ...], train_agents: str, matcher: str, lambda_pen: float,
                 needs_counts: bool, needs_matchtir: bool):
        self.reader, self.tasks, self.reward_fn = reader, tasks, reward_fn
        self.process, self.scope, self.matcher, self.lambda_pen = process, train_agents, matcher, lambda_pen
        self.needs_counts = needs_counts or "tool_format" in process
        self.needs_matchtir = needs_matchtir or "matchtir" in process

    def score(self, works: list[RolloutWork]) -> None:
        reported: dict[str, list[tuple[str | None, str, str, float]]] = defaultdict(list)
        with self.reader.engine.connect() as conn:
            q = (select(Reward.rollout_id, Reward.call_id, Reward.kind, Reward.name, Reward.value)
                 .where(Reward.rollout_id.in_([w.id for w in works])).order_by(Reward.id))
            for r in conn.execute(q):
                reported[r.rollout_id].append((r.call_id, r.kind, r.name, r.value))
        needs_requests = self.needs_counts or "dispatch_ok" in self.process
        requests = self.reader.requests([c for w in works for c in w.units]) if needs_requests else {}
        for w in works:
            task = self.tasks.get(w.task_id or "", {})
            if self.reward_fn is not None:
                w.outcome, w.has_outcome = float(self.reward_fn(final_answer(w) or "", task.get("reference"))), True
            outcomes = [value for _, kind, _, value in reported[w.id] if kind == "outcome"]
            if outcomes and self.reward_fn is None:
                w.outcome, w.has_outcome = reported_outcome(outcomes), True
                if len(outcomes) > 1:
                    w.stats["several_outcomes"] += 1  # the summary's note says which was used
            for call_id, kind, name, value in reported[w.id]:
                if kind == "process" and call_id in w.units:
                    w.units[call_id].process[name] = float(value)
            if self.needs_counts:
                for u in w.units.values():
                    tools = requests[u.call.call_id].get("tools")
                    u.calls_attempted = len(u.parse().calls)
                    u.calls_valid = sum(call_valid(c, tools) for c in u.parse().calls)
                    if "tool_format" in self.process:
                        u.process["tool_format"] = tool_format(u.parse().calls, tools)
            if "dispatch_ok" in self.process:
                for u in w.units.values():
                    nxt = result_call(u)
                    results = observed_results(requests[nxt].get("messages") or []) if nxt else []
                    u.process["dispatch_ok"] = dispatch_ok(len(u.parse().calls), results)
            if self.needs_matchtir:
                ts = turns(w, self.scope)
                for u, r in zip(ts, self._matchtir_turns(ts, task)):
                    u.process["matchtir"] = r
            if not w.has_outcome:
                w.stats["no_outcome"] += 1

    def _matchtir_turns(self, ts: list[Unit], task: dict[str, Any]) -> list[float]:
        refs = reference_calls(task.get("reference_calls"))
        preds, owner = [], []
        for t, u in enumerate(ts):
            for c in u.parse().calls:
                preds.append((c.name, c.arguments))
                owner.append(t)
        per_call = call_rewards(preds, refs, self.matcher, self.lambda_pen) if preds else []
        by_turn: list[list[float]] = [[] for _ in ts]
        for t, r in zip(owner, per_call):
            by_turn[t].append(r)
        final = len(ts) - 1 if ts and not ts[-1].parse().calls else None
        answer = ts[-1].parse().answer if final is not None else None
        return turn_rewards(by_turn, final, f1(answer or "", task.get("reference")) if final is not None else 0.0)
