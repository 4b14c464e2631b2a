"""`harnessrl demo`: every stage once, on the embedded default (tiny model, SQLite, CPU).

Builds the tiny model, runs the lookup harness through the proxy, compiles, trains, pushes
the new weights into the running proxy and evaluates — two rounds of `harnessrl loop` — then
shows what the records DB holds."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table
from sqlalchemy import func, select

from harnessrl.db import open_db
from harnessrl.loop import LoopConfig, run_loop
from harnessrl.records import Call, Reward, Rollout, WeightVersion


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


def run_demo(out: Path, rounds: int = 2, algo: str = "grpo") -> None:
    from harnessrl.tiny_model import build_tiny_model

    console = Console()
    out.mkdir(parents=True, exist_ok=True)
    model = out / "tiny-model"
    if not (model / "config.json").exists():
        console.rule("1. tiny model")
        build_tiny_model(model)
        console.print(f"built {model}")
    console.rule(f"2. loop: lookup harness → proxy → compile → train ({algo}) → push → eval")
    cfg = LoopConfig(harness="lookup", algo=algo, rounds=rounds, group=4, n_tasks=8, model=str(model),
                     out=out / "loop", steps=2, lr=1e-4)
    state = run_loop(cfg, console)
    console.rule("3. what was recorded")
    console.print(records_table(str(cfg.out / "runs.db")))
    console.print(f"samples, checkpoints and curves.png are under {cfg.out}; "
                  f"final weights: {state.model}")
