"""Learning benchmark: does RL through harnessrl improve a warm-started policy on held-out tasks?

1. Build the tiny model; SFT it on expert traces of the lookup task family (training keys only).
2. From that same warm start, with the same budget and seed, run `harnessrl loop` with each of
   grpo, capo, matpo and pact on the training tasks; evaluate greedily on held-out keys.
3. Print success before / after and the per-round held-out curve for every algorithm.

    python bench/learning.py [--rounds 3] [--sft-steps 60] [--out bench-out/learning]

Nothing is tuned per algorithm: one learning rate, one step count, one seed for all.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench-out/learning"))
    ap.add_argument("--algos", default="grpo,capo,matpo,pact")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--train-tasks", type=int, default=24)
    ap.add_argument("--eval-tasks", type=int, default=16)
    ap.add_argument("--sft-steps", type=int, default=400)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps per round")
    ap.add_argument("--batch-size", type=int, default=16, help="samples per optimizer step")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from harnessrl.harness_examples.lookup import tasks as lookup_tasks
    from harnessrl.app.loop import LoopConfig, run_loop
    from harnessrl.tiny_model import build_tiny_model
    from harnessrl.trainer.sft import SftConfig, sft

    console = Console()
    out = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tasks = lookup_tasks.generate(args.train_tasks + args.eval_tasks, args.seed)
    train_file = lookup_tasks.write(tasks[: args.train_tasks], out / "train.jsonl")
    all_file = lookup_tasks.write(tasks, out / "tasks.jsonl")  # training tasks first, held-out last

    t0 = time.perf_counter()
    base = build_tiny_model(out / "tiny", seed=args.seed)
    warm = sft(SftConfig(tasks=str(train_file), model=str(base), out=str(out / "warm"), steps=args.sft_steps,
                         lr=args.sft_lr, seed=args.seed))
    console.print(f"warm start: {args.sft_steps} SFT steps in {time.perf_counter() - t0:.0f} s")

    rows = []
    eval_fraction = args.eval_tasks / (args.train_tasks + args.eval_tasks)
    for algo in args.algos.split(","):
        t = time.perf_counter()
        state = run_loop(LoopConfig(harness="lookup", algo=algo, rounds=args.rounds, group=args.group, model=str(warm),
                                    out=out / algo, tasks=all_file, n_tasks=len(tasks), eval_fraction=eval_fraction,
                                    steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed),
                         Console(quiet=True))
        curve = [r["eval_success"] for r in state.rounds]
        train_curve = [r["train_success"] for r in state.rounds]
        rows.append((algo, state.initial_eval, curve, train_curve, time.perf_counter() - t))

    table = Table(title=f"lookup: held-out success (greedy, {args.eval_tasks} tasks), {args.rounds} rounds, "
                        f"group {args.group}, {args.steps}×{args.batch_size} samples/round, lr {args.lr}")
    for col in ("algo", "before", "after", "Δ", "held-out per round", "train success per round", "time (s)"):
        table.add_column(col)
    for algo, before, curve, train_curve, secs in rows:
        after = curve[-1]
        table.add_row(algo, f"{before:.3f}", f"{after:.3f}", f"{after - before:+.3f}",
                      " ".join(f"{c:.2f}" for c in curve), " ".join(f"{c:.2f}" for c in train_curve), f"{secs:.0f}")
    console.print(table)


if __name__ == "__main__":
    main()
