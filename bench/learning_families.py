"""The learning benchmark's task families (`bench/learning.py --family`), each where one paper's
effect can show (docs/benchmarks.md › Learning, Task families):

- `toolbox` (default): one decision, tool and item (harness_examples/toolbox).
- `capo-multihop`: two decisions, the second's argument the first's result, with per-decision
  process rewards (harness_examples/toolbox/multihop.py; harness `multihop`).
- `matpo-delegate`: those two hops delegated to workers whose tool outputs are long and noisy
  (harness `noisy_delegate`); the algorithms in `--single-agent` (default grpo) run the same
  tasks as one agent (harness `noisy_single`, its own warm start), the paper's comparison.
- `pact-sparse`: toolbox tasks and a warm start wrong on every line (`--expert-right 0`), so
  almost no group has a success; the expert traces are PACT's privileged signal.

A family gives, per seed, its training and held-out tasks, the warm start's SFT lines, the
writer of its tasks file and the loop's harness name (`Setup`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FAMILIES = ("toolbox", "capo-multihop", "matpo-delegate", "pact-sparse")
# --expert-traces / --expert-right when not given: the toolbox's mix, the two-hop families' per-hop mix
# (relation right, attribute right), and the sparse family's none right
EXPERT_DEFAULTS = {"toolbox": (5, "2"), "capo-multihop": (7, "3,5"), "matpo-delegate": (7, "3,5"),
                   "pact-sparse": (5, "0")}


@dataclass
class Setup:
    train: list[Any]
    held: list[Any]
    rows: list[dict]  # the warm start's SFT lines
    write: Callable[[list[Any], Any], Any]  # (tasks, path) → path of the loop's tasks file
    harness: str


def fill_defaults(args: argparse.Namespace) -> None:
    traces, right = EXPERT_DEFAULTS[args.family]
    args.expert_traces = traces if args.expert_traces is None else args.expert_traces
    args.expert_right = right if args.expert_right is None else str(args.expert_right)


def hop_right(args: argparse.Namespace) -> tuple[int, int]:
    try:
        first, second = (int(x) for x in str(args.expert_right).split(","))
    except ValueError:
        raise SystemExit(f"--expert-right {args.expert_right!r}: the {args.family} family takes two counts, "
                         "relation right,attribute right (e.g. 3,5)") from None
    return first, second


def setup(args: argparse.Namespace, seed: int, single: bool, sft_tasks: Callable[[list], list]) -> Setup:
    """The family's tasks and warm start for `seed`; `single`: matpo-delegate's single-agent side.
    `sft_tasks` chooses the warm start's tasks among the training ones (learning.sft_share)."""
    from harnessrl.harness_examples.toolbox import multihop, noisy_delegate, sparse

    if args.family == "capo-multihop":
        train, held = multihop.generate(seed)
        rows = _checked(lambda: multihop.inconsistent_expert(sft_tasks(train), multihop.world(seed),
                                                             args.expert_traces, hop_right(args)))
        return Setup(train, held, rows + _drill(args), multihop.write, "multihop")
    if args.family == "matpo-delegate":
        train, held = noisy_delegate.generate(seed, delegate=not single)
        rows = _checked(lambda: noisy_delegate.inconsistent_expert(sft_tasks(train), multihop.world(seed),
                                                                   args.expert_traces, hop_right(args)))
        planner = [] if single else noisy_delegate.drills() * args.copy_drill
        return Setup(train, held, rows + _drill(args) + planner, noisy_delegate.write,
                     "noisy_single" if single else "noisy_delegate")
    if args.family == "pact-sparse":
        from harnessrl.harness_examples.toolbox import tasks as toolbox

        train, held = sparse.generate(seed)
        rows = _checked(lambda: sparse.warm_start_rows(sft_tasks(train), seed, args.expert_traces,
                                                       int(args.expert_right), args.copy_drill))
        return Setup(train, held, rows, toolbox.write, "toolbox")
    raise SystemExit(f"--family {args.family!r}: use {' | '.join(FAMILIES)}")


def _drill(args: argparse.Namespace) -> list[dict]:
    """The copy drill (items into `item` arguments), as the toolbox's warm start has it."""
    from harnessrl.harness_examples.toolbox import tasks as toolbox

    return toolbox.copy_drill(compact=True) * args.copy_drill


def _checked(make: Callable[[], list[dict]]) -> list[dict]:
    try:
        return make()
    except ValueError as exc:
        raise SystemExit(f"--expert-traces/--expert-right: {exc}") from None


def validation(train: list[Any], rl: list[Any]) -> list[Any]:
    """The validation split: the training side's tasks that RL does not train on (with the default
    --train-tasks 32, every item's second training task), in task order. Disjoint from RL's tasks
    by construction and from the held-out ones by the generator's split; the warm start was fitted
    on them as on RL's."""
    chosen = {id(t) for t in rl}
    rest = [t for t in train if id(t) not in chosen]
    if not rest:
        raise SystemExit("--eval-on validation: RL trains on every training task; lower --train-tasks")
    return rest
