"""Truly sparse reward on the toolbox (the PACT family): a warm start that almost never succeeds,
with the expert's traces as the privileged signal.

PACT's setting is a policy whose own rollouts rarely succeed, so an outcome reward gives almost no
group any signal, while expert trajectories exist. Here the tasks are the toolbox's, and the warm
start imitates an expert that calls the wrong attribute's tool on every line (`CONFUSE`, a cycle
over all four attributes; `right` = 0 of `traces`): greedy it never succeeds, and sampled it
finds the right tool only by drifting off what it was fitted on. The tasks file still carries
each task's right call as its `expert_trace`, which PACT puts in the privileged context and
its SFT term (docs/methods.md, PACT); GRPO sees only the outcome.
"""

from __future__ import annotations

from typing import Any

from harnessrl.harness_examples.toolbox import tasks as toolbox

# every attribute asked is answered with the next one's tool
CONFUSE = {"color": "size", "size": "owner", "owner": "city", "city": "color"}


def generate(seed: int = 0) -> tuple[list[toolbox.ToolboxTask], list[toolbox.ToolboxTask]]:
    """The toolbox's tasks (compact prompt): 64 training and 64 held-out."""
    return toolbox.generate(seed, compact=True)


def warm_start_rows(tasks: list[toolbox.ToolboxTask], seed: int, traces: int = 5, right: int = 0,
                    copy_drill: int = 1) -> list[dict[str, Any]]:
    """The warm start's SFT lines: the all-confused expert's (`right` of `traces` lines right) on
    `tasks` in the seed's world, and the copy drill (the item skill, which the sparse setting
    keeps: only the tool is wrong)."""
    rows = toolbox.inconsistent_expert(tasks, toolbox.world(seed), CONFUSE, traces, right)
    return rows + toolbox.copy_drill(compact=True) * copy_drill
