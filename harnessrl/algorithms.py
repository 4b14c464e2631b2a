"""The algorithm registry: every `--algo` name with the compile defaults it is defined with.

An objective is a pair of decisions made in two parts: the compiler's advantage estimator and
training scope (which agents' tokens are trainable), and the trainer's loss. Both parts read the
same entry here, so `harnessrl compile --algo matpo`, `harnessrl train --algo matpo` and
`harnessrl loop --algo matpo` agree. The trainer maps each name to its trainer class
(`harnessrl.trainer.run.TRAINERS`); a test checks both cover the same names.
See docs/methods.md (Objectives) for the math behind each entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from harnessrl.errors import UserError


@dataclass(frozen=True)
class Algorithm:
    name: str
    advantage: str  # the compiler's advantage estimator (docs/methods.md, Advantages)
    train_agents: str  # central | all | comma-separated agent names
    # the trainer's default loss aggregation (docs/methods.md, Loss aggregation): the paper's for matpo
    # and pact; for grpo a choice (its paper averages per sequence, seq_mean; docs/methods.md §6.1)
    loss_agg: str
    summary: str
    # the compiler's process rewards (docs/methods.md §4) that the paper's objective uses beside the
    # outcome; () for an outcome-only paper. `--process` replaces them (`--process none`: outcome only).
    process: tuple[str, ...] = ()
    # its gradients are routed by a static partition of the model's units, built once from the first
    # successful rollouts and kept for the whole run (CAPO; trainer/capo_partition.py)
    partition: bool = False


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    # token_mean and β = 0 (trainer/config.py kl_beta) are this project's choices, not DeepSeekMath's GRPO
    # (per-sequence mean, a KL term): the baseline is the plain clipped surrogate (docs/methods.md §6.1)
    Algorithm("grpo", "grpo", "central", "token_mean", "clipped surrogate on the group-normalised outcome (baseline; "
              "token mean and no KL by choice, the paper's: --loss-agg seq_mean --beta 0.04)"),
    # Harness-RL "combines rollout-level outcome rewards with decision-level process rewards"; it names
    # no process function, so the two the interface records alone can score per decision: the call as
    # written (tool exists, arguments fit its schema: the action and the args) and as dispatched (the
    # tool or sub-agent answered without an error). docs/methods.md §5 `harness`.
    Algorithm("capo", "harness", "central", "token_mean", "outcome + process rewards; action/args gradients routed to "
              "partitions of attention heads and MLP units",
              ("tool_format", "dispatch_ok"), partition=True),
    Algorithm("matpo", "matpo", "all", "rollout_mean", "planner and worker samples in one batch, one model for every role"),
    Algorithm("pact", "matchtir", "central", "prompt_mean", "expert traces as privileged context plus component-aware SFT"),
)}


def get_algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise UserError(f"unknown --algo {name!r}: use {' | '.join(ALGORITHMS)}") from None


def algo_help() -> str:
    """The `--algo` help text every command shows."""
    return "; ".join(f"{a.name}: {a.summary}" for a in ALGORITHMS.values())


def process_rewards(algo: Algorithm | None, flag: str | None) -> tuple[str, ...]:
    """The process rewards to compile with: `--process` as given (comma-separated; `none`: none),
    else the algorithm's own (none without an algorithm)."""
    if flag is None:
        return algo.process if algo is not None else ()
    names = tuple(p.strip() for p in flag.split(",") if p.strip())
    return () if names == ("none",) else names


def default_train_agents(advantage: str) -> str:
    """The training scope of the algorithm an estimator belongs to (`central` if none claims it),
    so `compile --advantage matpo` trains planner and workers like `--algo matpo` does."""
    for algo in ALGORITHMS.values():
        if algo.advantage == advantage:
            return algo.train_agents
    return "central"
