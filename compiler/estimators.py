"""The `--advantage` registry: each estimator maps a batch of scored rollouts (whole groups) onto
the math in `advantages.py` and sets `Unit.advantage` on every decision unit it trains.

Adding one: write `def mine(works, ctx) -> None` that sets `u.advantage` (use `ctx.cfg` for
constants and pass `ctx.counts` to the normalisers so groups of one are reported), and register
it with `@estimator("mine", uses_outcome=..., needs_counts=..., needs_matchtir=...)`.
`uses_outcome`: rollouts without an outcome are left out under `--missing-outcome skip`;
`needs_counts`: scoring fills `calls_valid` / `calls_attempted`; `needs_matchtir`: scoring
fills the `matchtir` turn rewards.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from harnessrl.compiler import advantages as adv
from harnessrl.compiler.reader import RolloutWork
from harnessrl.compiler.scoring import turns
from harnessrl.errors import UserError


@dataclass
class EstimatorContext:
    cfg: adv.AdvantageConfig
    train_agents: str
    counts: Counter = field(default_factory=Counter)  # singleton_groups, singleton_buckets


@dataclass(frozen=True)
class Estimator:
    name: str
    fn: Callable[[list[RolloutWork], EstimatorContext], None]
    uses_outcome: bool
    needs_counts: bool
    needs_matchtir: bool


ESTIMATORS: dict[str, Estimator] = {}


def estimator(name: str, uses_outcome: bool = True, needs_counts: bool = False, needs_matchtir: bool = False):
    def register(fn):
        ESTIMATORS[name] = Estimator(name, fn, uses_outcome, needs_counts, needs_matchtir)
        return fn
    return register


def get(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise UserError(f"unknown advantage estimator {name!r}: use {', '.join(ESTIMATORS)}")
    return ESTIMATORS[name]


def _groups(works: list[RolloutWork]) -> dict[str, str]:
    return {w.id: w.group_id for w in works}


@estimator("grpo")
def grpo(works: list[RolloutWork], ctx: EstimatorContext) -> None:
    a = adv.grpo({w.id: w.outcome for w in works}, _groups(works), ctx.cfg, ctx.counts)
    for w in works:
        for u in w.units.values():
            u.advantage = a[w.id]


@estimator("harness")
def harness(works: list[RolloutWork], ctx: EstimatorContext) -> None:
    """Process reward of a unit: the mean of its process rewards (none: Ã = 0)."""
    units = {}
    for w in works:
        for cid, u in w.units.items():
            r = float(np.mean(list(u.process.values()))) if u.process else None
            units[cid] = (w.id, u.call.agent or "", u.tree.nodes[u.node].decision_index, r)
    a = adv.harness({w.id: w.outcome for w in works}, _groups(works), units, ctx.cfg, ctx.counts)
    for w in works:
        for cid, u in w.units.items():
            u.advantage = a[cid]


def _success_rate(units) -> float:
    """Valid calls ÷ calls attempted (MATPO's fmt); 1.0 when no call was attempted."""
    attempted = sum(u.calls_attempted for u in units)
    return sum(u.calls_valid for u in units) / attempted if attempted else 1.0


@estimator("matpo", needs_counts=True)
def matpo(works: list[RolloutWork], ctx: EstimatorContext) -> None:
    """fmt_p: the planner's success rate over all its call attempts; fmt_w: the mean over its
    worker sessions of each session's success rate (0 with no worker session)."""
    fmt_p, fmt_w = {}, {}
    for w in works:
        fmt_p[w.id] = _success_rate([u for u in w.units.values() if u.call.agent == w.central])
        fmt_w[w.id] = [_success_rate([w.units[n.call.call_id] for n in t.nodes])
                       for t in w.trees if t.nodes[0].call.agent != w.central]
    a = adv.matpo({w.id: w.outcome for w in works}, fmt_p, fmt_w, _groups(works), ctx.cfg, ctx.counts)
    for w in works:
        for u in w.units.values():
            u.advantage = a[w.id]


@estimator("matchtir", uses_outcome=False, needs_matchtir=True)
def matchtir(works: list[RolloutWork], ctx: EstimatorContext) -> None:
    ts = {w.id: turns(w, ctx.train_agents) for w in works}
    a = adv.matchtir({k: [u.process["matchtir"] for u in us] for k, us in ts.items()}, _groups(works),
                     ctx.cfg, ctx.counts)
    for k, us in ts.items():
        for u, value in zip(us, a[k]):
            u.advantage = value
