"""`harnessrl loop`'s settings: each flag defined once, on its field, with its help
(`harnessrl.cli_options`); `sync.py` and `async_driver.py` run them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harnessrl.algorithms import algo_help
from harnessrl.app.rollouts.cli import REWARD_FROM_HELP
from harnessrl.app.rollouts.harnesses import harness_help
from harnessrl.app.rollouts.limited_run import RolloutFlags
from harnessrl.cli_options import option

HARNESS, TRAINING, ROLLOUTS, OUTPUT, TEACHER = "Harness", "Training", "Rollouts", "Records and output", "Teacher"
ASYNC = "Asynchronous (--async)"
CMD = "--cmd rollouts"  # the panel of the per-rollout limits, which the command defines with `run`'s


@dataclass
class Teacher:
    """A warm-up round against a stronger model before round 0 (`--teacher URL`)."""

    url: str | None = option(  # the teacher's base URL (vLLM, an OpenAI-compatible or a hosted API)
        None, "--teacher", panel=TEACHER, help="A stronger model's base URL: a warm-up round runs the harness against "
        "it first, and its best rollouts become expert traces (SFT warm start, PACT).")
    key: str | None = option(None, "--teacher-api-key", deprecated=("--teacher-key",),
                             envvar="HARNESSRL_TEACHER_API_KEY", panel=TEACHER, help="The teacher's API key (never recorded).")
    dialect: str = option(  # what it speaks (proxy --upstream-dialect)
        "openai-chat", "--teacher-dialect", panel=TEACHER, help="openai-chat | openai-responses | anthropic.")
    model: str | None = option(  # the model name to ask it for (proxy --upstream-model)
        None, "--teacher-model", panel=TEACHER, help="Model name to ask the teacher for.")
    ca: str | None = option(None, "--teacher-ca", panel=TEACHER, help="CA file for an https:// teacher.")
    min_reward: float | None = option(  # only rollouts at least this good become traces
        None, "--teacher-min-reward", panel=TEACHER,
        help="Only teacher rollouts with at least this outcome become traces.")
    sft_steps: int = option(  # warm-up SFT steps on the traces (0: traces for PACT only)
        200, "--teacher-sft-steps", panel=TEACHER, help="Warm-up SFT steps on the traces.")


@dataclass
class LoopConfig:
    harness: str = option("", panel=HARNESS, help=harness_help())  # "" with `cmd`
    algo: str = option("grpo", panel=TRAINING, help=algo_help())
    rounds: int = option(2, panel=TRAINING, help="Rounds of rollouts → compile → train → push → eval (--async: "
                         "--rounds × --steps optimizer steps in all).")
    group: int = option(4, "--group-size", deprecated=("--group",), panel=TRAINING,
                        help="Rollouts per training task per round (the GRPO group).")
    model: str = option("", required=True, panel=TRAINING, help="Model directory the first round starts from.")
    db: str = option("", panel=OUTPUT, help="Records DB (default: OUT/runs.db).")
    out: Path = option(Path("loop"), panel=OUTPUT, help="Output directory: state, samples, checkpoints, curves.")
    tasks: Path | None = option(None, panel=HARNESS, help="Task file of the harness (default: generated tasks).")
    corpus: Path | None = option(  # search harnesses: a real corpus JSONL beside a real QA --tasks file
        None, panel=HARNESS, help="Search harnesses: corpus JSONL for a real --tasks QA file.")
    n_tasks: int | None = option(None, panel=HARNESS, help="Tasks to use, generated or the first of --tasks "
                                 "(default 8; the toolbox families: their 64 + 64, or all of --tasks).")
    eval_fraction: float = option(0.25, panel=HARNESS, help="Fraction of the tasks held out for evaluation.")
    process: str | None = option(  # compile's process rewards; default: the --algo's paper's (harnessrl/algorithms.py)
        None, panel=TRAINING, help="Process rewards compiled beside the outcome, comma-separated: tool_format, "
        "dispatch_ok, matchtir; none: outcome only (default: the --algo's paper's; capo: tool_format,dispatch_ok).")
    steps: int = option(2, panel=TRAINING, help="Optimizer steps per round.")
    batch_size: int = option(8, panel=TRAINING, help="Samples per optimizer step (--async: a step takes whole groups, "
                             "--groups-per-step).")
    lr: float = option(1e-4, panel=TRAINING, help="Learning rate.")
    carry_optimizer: bool = option(  # trainer/optimizer_state.py: rounds and pushes do not restart Adam
        True, "--carry-optimizer/--fresh-optimizer", panel=TRAINING, help="Start each round's (--async: each push's) "
        "optimizer from the last checkpoint's state, as one long training run; --fresh-optimizer restarts Adam.")
    temperature: float = option(1.0, panel=ROLLOUTS, help="Sampling temperature of training rollouts.")
    concurrency: int = option(8, panel=ROLLOUTS, help="Rollouts in flight at once.")
    seed: int = option(0, panel=TRAINING, help="Seed of tasks, sampling and training.")
    # capo: one partition file for the loop; default OUT/capo_partition.pt (the trainer builds it at the first success)
    partition: str | None = None
    cmd: str | None = option(  # an external program as the harness, instead of `harness`
        None, panel=HARNESS, help="Instead of --harness: a shell line run per task and sample, with {task} (JSON "
        "file: id, input), {input} (the task statement), {task_id}, {base_url}, {rollout}, {temperature}; "
        "needs --tasks.")
    reward: str | None = option(  # compile-time outcome reward against the tasks' references
        None, panel=HARNESS, help="Compile-time outcome reward against the tasks' references (f1 | exact_match | "
        "contains | module:fn); default: the reported outcome.")
    reward_from: str | None = option(  # --cmd: exit-code | stdout-json | file
        None, panel=CMD, help="--cmd: " + REWARD_FROM_HELP + " Default: what the program reported itself.")
    intercept: bool = option(  # --cmd: route hard-coded LLM API hosts through one mitmdump
        False, "--intercept/--no-intercept", panel=CMD,
        help="--cmd: route hard-coded LLM API hosts through mitmproxy (.venv-mitm).")
    teacher: Teacher | None = None  # a warm-up round against a stronger model first
    train_config: Path | None = option(  # YAML of further trainer options (`harnessrl train --config`) for every round
        None, panel=TRAINING, help="YAML of further trainer options for every round (as `harnessrl train --config`, "
        "e.g. ratio_to, beta, epsilon); the flags above take precedence.")
    upstream: str | None = option(  # a vLLM serving `model` (`harnessrl vllm`): rollouts go to it, pushes reload it
        None, panel=ROLLOUTS, help="A vLLM serving --model (`harnessrl vllm MODEL`): rollouts go to it and each "
        "round's checkpoint is reloaded into it (default: the proxy's embedded CPU backend).")
    executor: str = option(  # where rollouts run: local (threads here) | ray (tasks on a Ray cluster's nodes)
        "local", panel=ROLLOUTS, help="Where rollouts run: local (threads of this process) | ray (each a Ray task on "
        "any node of a Ray cluster; the `ray` extra).")
    ray_address: str | None = option(  # --executor ray: the cluster's head; default: a new local one
        None, panel=ROLLOUTS, help="--executor ray: the cluster's head, HOST:PORT (its GCS port) or auto; default: a "
        "new one-node Ray here.")
    rollout_deadline: float | None = option(  # seconds before a rollout is given up (default: DEFAULT_DEADLINE)
        None, panel=ROLLOUTS, help="Seconds after which a rollout still out is given up and counted as failed (a "
        "backstop above the harness's own timeout; default: with --cmd twice --timeout + 120, else 3600).")
    # --cmd: each rollout's sandbox, timeout (`cmd_flags.timeout`), memory and CPU limits, test reward
    cmd_flags: RolloutFlags = field(default_factory=RolloutFlags)
    # --async (loop/async_driver.py): rollouts, compile and training overlap, without rounds
    async_: bool = option(False, "--async/--sync", panel=ASYNC, help="Rollouts keep running while the trainer trains "
                          "on the groups that finished (docs/training.md, Asynchronous RL).")
    groups_per_step: int = option(2, panel=ASYNC, help="Finished groups (a task's --group-size rollouts) per "
                                  "optimizer step.")
    push_every: int = option(1, panel=ASYNC, help="Optimizer steps between weight pushes.")
    max_queued_steps: int = option(2, panel=ASYNC, help="Steps of finished groups that may wait for the trainer; "
                                   "beyond that no new group starts.")
    max_staleness: int = option(2, panel=ASYNC, help="Weight versions a trained token may lag the weights it trains: "
                                "a group with an older one is dropped (0: on-policy).")
    eval_every: int = option(0, panel=ASYNC, help="Optimizer steps between held-out evaluations on the version they "
                             "pushed, pinned, beside training (0: at the end only).")
