"""Sub-commands of the compiler: `compile`, `inspect`, `tasks import`, `traces from-rollouts`."""

from __future__ import annotations

from pathlib import Path

import typer

from harnessrl.algorithms import default_train_agents, get_algorithm, process_rewards
from harnessrl.cli_options import algo_option, positional_db, records_db, records_db_option

tasks_app = typer.Typer(help="Tasks and expert traces in the records DB.", no_args_is_help=True)
traces_app = typer.Typer(help="Expert traces (for `sft` and PACT).", no_args_is_help=True)


# the help panels of `compile`
INPUT, REWARDS, ADVANTAGES, SAMPLES = "Input", "Rewards", "Advantages", "Samples"


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def compile_cmd(
    db_arg: str | None = positional_db(),
    db: str | None = records_db_option(None, panel=INPUT),
    rollouts: str = typer.Option("", "--rollouts", rich_help_panel=INPUT,
                                 help="Only these rollout ids (comma-separated)."),
    since: str | None = typer.Option(None, "--since", rich_help_panel=INPUT,
                                     help="Only rollouts created at or after (epoch or ISO time)."),
    run: str | None = typer.Option(None, "--run", rich_help_panel=INPUT, help="Only rollouts of this run."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", rich_help_panel=INPUT,
                                         help="Tokenizer directory (default: the recorded model dir)."),
    reward: str | None = typer.Option(None, "--reward", rich_help_panel=REWARDS,
                                      help="Outcome reward: f1 | exact_match | contains | module:fn "
                                      "(default: the harness-reported outcome)."),
    process: str | None = typer.Option(None, "--process", rich_help_panel=REWARDS,
                                       help="Process rewards, comma-separated: tool_format,dispatch_ok,matchtir; "
                                       "none: outcome only (default: the --algo's paper's, e.g. capo: "
                                       "tool_format,dispatch_ok; none without --algo)."),
    missing_outcome: str = typer.Option("skip", "--missing-outcome", rich_help_panel=REWARDS,
                                        help="Rollouts without an outcome reward: "
                                        "skip (left out of groups and samples) | zero (scored 0)."),
    on_call_error: str = typer.Option("drop", "--on-call-error", rich_help_panel=REWARDS,
                                      help="Rollouts in which a call was refused or "
                                      "failed (the harness got an error; a stream it abandoned or a best_of "
                                      "sample not returned is not one): drop (no samples, and left out of their "
                                      "group's mean and std) | keep (compiled like any other)."),
    sampling_policy: Path | None = typer.Option(None, "--sampling-policy", rich_help_panel=REWARDS,
                                                help="YAML sampling policy (the "
                                                "proxy's): calls recorded with parameters that break it are handled "
                                                "by --policy-action (counted in stats)."),
    policy_action: str = typer.Option("drop", "--policy-action", rich_help_panel=REWARDS,
                                      help="Samples that train on an off-policy call: "
                                      "drop (left out) | mask (those turns get mask 0) | flag (kept, counted)."),
    algo: str | None = algo_option(None, "Compile for this objective: its registry entry sets the defaults of "
                                   "--advantage and --train-agents. ", panel=ADVANTAGES),
    advantage: str | None = typer.Option(None, "--advantage", rich_help_panel=ADVANTAGES,
                                         help="grpo | harness | matpo | matchtir "
                                         "(default: the --algo's estimator, else grpo)."),
    train_agents: str | None = typer.Option(None, "--train-agents", rich_help_panel=ADVANTAGES,
                                            help="central | all | comma-separated agent names "
                                            "(default: the --algo's scope, else the scope of the estimator's "
                                            "algorithm: all for matpo, central otherwise)."),
    matcher: str = typer.Option("hungarian", "--matcher", rich_help_panel=ADVANTAGES,
                                help="MatchTIR matcher: hungarian | greedy."),
    std: str | None = typer.Option(None, "--std", rich_help_panel=ADVANTAGES,
                                   help="Normalisation std: sample | population (default sample)."),
    adv_config: Path | None = typer.Option(None, "--adv-config", rich_help_panel=ADVANTAGES,
                                           help="YAML/JSON file of advantage constants: "
                                           "lambda_proc, lambda_pen, gamma, alpha, eps, std, proc_norm, matpo_acc, "
                                           "matpo_fmt, matpo_norm, singleton (flags override it)."),
    singleton: str | None = typer.Option(None, "--singleton", rich_help_panel=ADVANTAGES,
                                         help="A group or turn bucket of one rollout: "
                                         "zero (advantage 0, default) | raw (its raw value)."),
    out: Path = typer.Option(Path("compiled"), "--out", rich_help_panel=SAMPLES, help="Output directory."),
    mask_truncated: bool = typer.Option(False, "--mask-truncated", rich_help_panel=SAMPLES,
                                        help="A session path whose last call was cut "
                                        "by max_tokens (an unfinished turn): train nothing on that turn (counted)."),
    unmarked_answer: str = typer.Option("args", "--unmarked-answer", rich_help_panel=SAMPLES,
                                        help="Class of a final answer without a marker: args | reasoning."),
    jobs: int = typer.Option(0, "--jobs", rich_help_panel=SAMPLES, min=0,
                             help="Worker processes, each compiling whole batches of groups "
                             "(0: one per CPU; output identical to --jobs 1)."),
) -> None:
    """Compile recorded calls into training samples (Parquet) with rewards and advantages."""
    from harnessrl.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from harnessrl.compiler.advantages import load_adv_config
    from harnessrl.sampling_policy import load_policy
    from harnessrl.compiler.pipeline import CompileOptions, Compiler
    from harnessrl.compiler.labels import ClassConfig
    from harnessrl.compiler.summary import summary_notes, summary_table

    db = records_db(db, db_arg)
    spec = get_algorithm(algo) if algo is not None else None
    if spec is not None:
        advantage = advantage or spec.advantage
        train_agents = train_agents or spec.train_agents
    advantage = advantage or "grpo"
    train_agents = train_agents or default_train_agents(advantage)
    opts = CompileOptions(out=out, reward=reward, process=process_rewards(spec, process), advantage=advantage,
                          train_agents=train_agents, rollouts=_split(rollouts), since=since, run=run,
                          tokenizer=tokenizer, matcher=matcher, missing_outcome=missing_outcome,
                          on_call_error=on_call_error,
                          mask_truncated=mask_truncated, policy_action=policy_action,
                          sampling_policy=load_policy(sampling_policy) if sampling_policy else None,
                          adv_config=load_adv_config(adv_config, std=std, singleton=singleton),
                          class_config=ClassConfig(unmarked_answer=unmarked_answer), jobs=jobs)
    compiler = Compiler(db, opts)
    console = Console()
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("compiling rollouts", total=None)
        stats = compiler.run(lambda done, total: bar.update(task, completed=done, total=total))
    console.print(summary_table(stats["totals"]))
    for note in summary_notes(stats):
        console.print(note)
    console.print(f"samples written to [bold]{out / 'samples.parquet'}[/bold]")


def inspect_cmd(
    db_arg: str | None = positional_db(),
    db: str | None = records_db_option(None),
    rollout: str = typer.Option(..., "--rollout", help="Rollout id."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="Tokenizer directory (default: the recorded model dir)."),
    max_chars: int = typer.Option(400, "--max-chars", help="Characters of each completion to show."),
) -> None:
    """Print a rollout's session trees: calls, agents, merges and breaks, token classes coloured."""
    from harnessrl.console import Console

    from harnessrl.compiler.inspect_rollout import rollout_tree

    Console().print(rollout_tree(records_db(db, db_arg), rollout, tokenizer, max_chars))


def tasks_import(
    file: Path = typer.Argument(..., help="JSONL: id, input, reference, reference_calls?, expert_trace?"),
    db: str = records_db_option(),
) -> None:
    """Import tasks (and expert traces) into the records DB."""
    from harnessrl.console import Console

    from harnessrl.compiler.tasks import import_tasks
    from harnessrl.db import shown_db

    n_tasks, n_traces = import_tasks(db, file)
    Console().print(f"imported {n_tasks} tasks ({n_traces} with expert traces) into {shown_db(db)}")


def traces_from_rollouts(
    db_arg: str | None = positional_db(),
    db: str | None = records_db_option(None),
    out: Path | None = typer.Option(None, "--out", help="Write a tasks JSONL (one trace per task) here."),
    into_db: bool = typer.Option(False, "--into-db", help="Add the traces to the DB's expert-trace table instead."),
    run: str | None = typer.Option(None, "--run", help="Only rollouts of this run (e.g. the teacher's)."),
    min_reward: float | None = typer.Option(None, "--min-reward", help="Only rollouts whose outcome is at least this."),
    agent: str | None = typer.Option(None, "--agent", help="The agent whose conversation is the trace "
                                     "(default: the agent of each rollout's first call)."),
    per_task: int = typer.Option(1, "--per-task", help="Distinct traces kept per task, best first (--into-db only)."),
) -> None:
    """Turn the best recorded rollouts of each task (any upstream) into expert traces."""
    from harnessrl.console import Console

    from harnessrl.compiler.expert_traces import collect, write_db, write_jsonl
    from harnessrl.db import shown_db
    from harnessrl.errors import UserError

    db = records_db(db, db_arg)
    if (out is None) == (not into_db):
        raise UserError("give exactly one of --out FILE and --into-db")
    traces, stats = collect(db, run, min_reward, agent, per_task)
    if out is not None:
        write_jsonl(traces, out)
        Console().print(f"{stats.line()}; written to {out}")
    else:
        Console().print(f"{stats.line()}; {write_db(db, traces)} added to {shown_db(db)}")


def register(app: typer.Typer) -> None:
    """Add this part's commands to the main app."""
    app.command("compile")(compile_cmd)
    app.command("inspect")(inspect_cmd)
    tasks_app.command("import")(tasks_import)
    app.add_typer(tasks_app, name="tasks")
    traces_app.command("from-rollouts")(traces_from_rollouts)
    app.add_typer(traces_app, name="traces")
