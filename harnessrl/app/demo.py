"""`harnessrl demo`: every stage once, on the embedded default (tiny model, SQLite, CPU).

Builds the tiny model, warms it up with SFT on expert traces of the lookup task family, runs
the lookup harness through the proxy, compiles, trains, pushes the new weights into the
running proxy and evaluates — two rounds of `harnessrl loop` — then shows what the records DB
holds."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from sqlalchemy import func, select

from harnessrl.app.loop import run_loop
from harnessrl.app.loop_config import LoopConfig
from harnessrl.console import Console
from harnessrl.db import open_db
from harnessrl.harness_examples.lookup import tasks as lookup_tasks
from harnessrl.records import Call, Reward, Rollout, WeightVersion
from harnessrl.tiny_model import build_tiny_model
from harnessrl.trainer.sft import SftConfig, sft


def records_table(db: str) -> Table:
    """Per run tag: rollouts, calls and how their prompts were built, tokens, rewards, versions."""
    _, Session = open_db(db)
    table = Table(title=f"records in {db}")
    for col in ("run", "rollouts", "calls ok/all", "prompt prefix/render", "drift", "completion tokens",
                "outcome rewards", "weight versions"):
        table.add_column(col, justify="right")
    with Session() as s:
        calls = s.execute(select(Rollout.run, Call.status, Call.prompt_path, Call.drift, Call.completion_tokens,
                                 Call.weight_version).join(Rollout, Call.rollout_id == Rollout.id)).all()
        rollouts = dict(s.execute(select(Rollout.run, func.count()).group_by(Rollout.run)).all())
        rewards = dict(s.execute(select(Rollout.run, func.count()).join(Reward, Reward.rollout_id == Rollout.id)
                                 .where(Reward.kind == "outcome").group_by(Rollout.run)).all())
        n_versions = s.scalar(select(func.count()).select_from(WeightVersion))
    for run in sorted(rollouts, key=str):
        mine = [c for c in calls if c.run == run]
        table.add_row(run or "-", str(rollouts[run]), f"{sum(c.status == 'ok' for c in mine)}/{len(mine)}",
                      f"{sum(c.prompt_path == 'prefix' for c in mine)}/{sum(c.prompt_path == 'render' for c in mine)}",
                      str(sum(bool(c.drift) for c in mine)), str(sum(c.completion_tokens or 0 for c in mine)),
                      str(rewards.get(run, 0)), str(len({c.weight_version for c in mine})))
    table.caption = f"weight versions pushed: {n_versions}"
    return table


def run_demo(out: Path, rounds: int = 2, algo: str = "grpo", sft_steps: int = 400) -> None:
    console = Console()
    out.mkdir(parents=True, exist_ok=True)
    model = out / "tiny-model"
    if not (model / "config.json").exists():
        console.rule("1. tiny model")
        build_tiny_model(model)
        console.print(f"built {model}")
    tasks = lookup_tasks.generate(12, seed=0)
    n_train = 9  # the last 3 are held out (the loop's --eval-fraction 0.25)
    tasks_file = lookup_tasks.write(tasks, out / "tasks.jsonl")
    warm = out / "warm-model"
    if sft_steps and not (warm / "config.json").exists():
        console.rule(f"2. warm start: {sft_steps} SFT steps on expert traces of the training tasks")
        sft(SftConfig(tasks=str(lookup_tasks.write(tasks[:n_train], out / "train.jsonl")), model=str(model),
                      out=str(warm), steps=sft_steps))
    start = warm if sft_steps else model
    console.rule(f"3. loop: lookup harness → proxy → compile → train ({algo}) → push → eval")
    cfg = LoopConfig(harness="lookup", algo=algo, rounds=rounds, group=4, model=str(start), tasks=tasks_file,
                     n_tasks=len(tasks), eval_fraction=0.25, out=out / "loop", steps=2, batch_size=16, lr=1e-4)
    state = run_loop(cfg, console)
    console.rule("4. what was recorded")
    console.print(records_table(str(cfg.out / "runs.db")))
    console.print(f"samples, checkpoints and curves.png are under {cfg.out}; final weights: {state.model}")
    console.print(f"open the trace viewer: [bold]harnessrl ui --db {cfg.out / 'runs.db'} --loop {cfg.out}" + "".join(
        f" --samples {d}" for d in sorted(cfg.out.glob("round-*/samples"), key=lambda p: p.stat().st_mtime)[-1:]) + "[/bold]")
