"""Async benchmark: `harnessrl loop --async` against the synchronous loop on the same tasks, the
same number of optimizer steps and the same samples per step, with rollouts whose length varies
like real CLI sessions (issue 43 §6).

Toolbox family (`--harness toolbox_slow`, harness_examples/toolbox/slow.py): the toolbox's tasks,
each rollout's environment spending a per-task delay drawn from a lognormal (median
`--delay-median`, σ 0.7: the 95th percentile 10× the 5th) inside its first tool call, so the
model calls stay short and the rollouts long. One task set and one SFT warm start (bench/learning.py's
inconsistent expert, `--sft-steps`; task seed 0); per seed (the loop's `--seed`) each mode runs
`harnessrl loop` as its own process from it (the same start-up cost for each), in an order that
rotates with the seed:

- `sync`: `--rounds` rounds of `--train-tasks` tasks × `--group-size`, each trained for
  `--steps` steps of `--batch-size` samples (every rollout once), held-out eval after each round;
- `async`: `--async`, rounds × steps optimizer steps of batch ÷ group groups each (the same
  samples per step), a push after every step, `--max-staleness`, held-out eval every `--steps`
  steps on a pinned version (the same evaluation points as sync), the default correction;
- `async-plain`: the same with the correction off, the plain ratio π_θ/π_behaviour with no clip
  (train-config `{ratio_to: behaviour, tis: false, epsilon: 1.0e+9}`): what the loss and the
  held-out success do without it;
- `async-s0` (not in the default `--modes`): `async` at `--max-staleness 0`, on-policy: what
  S = 0 costs in wall time.

Coding family (`--families coding`): the built-in coding agent (`--cmd`) on generated coding
tasks in the bubblewrap sandbox, hidden-test rewards, the tiny base model: sync vs async, one seed; real
rollouts of seconds each whose length varies with what the agent does.

Reported per mode (bench/async_stats.py says how each is measured): wall time, trainer idle and
inference idle fractions, mean/max staleness, dropped-stale groups, held-out success at the last
step (Wilson 95 % over the pooled seed × task outcomes), the no-idle bound max(rollout time ÷
concurrency, trainer time) of the same run, and the issue's targets (async wall ≤ 0.5× sync;
≤ 1.25× the bound; trainer idle ≤ 20 %; held-out success not below sync's interval).

    python bench/async_loop.py                              # 3 seeds × sync, async, async-plain; coding
    python bench/async_loop.py --quick --out /tmp/aq        # smoke run: small sizes, one seed
    python bench/async_loop.py --report-only --out DIR      # the tables again from DIR/results.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_report import report  # noqa: E402
from async_stats import measure  # noqa: E402

MODES = ("sync", "async", "async-plain", "async-s0")
TASK_SEED = 0  # the tasks' and the warm start's seed; --seeds are the loops'
PLAIN = "ratio_to: behaviour\ntis: false\nepsilon: 1.0e+9\n"  # the correction off: the plain ratio, unclipped
CORRECTIONS = {"async-plain": PLAIN}  # a mode's trainer options (bench/async_real.py adds the other corrections')
Launch = tuple[list[str], dict[str, str]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench-out/async"))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--modes", default="sync,async,async-plain", help="of " + ", ".join(MODES))
    ap.add_argument("--families", default="toolbox,coding",
                    help="toolbox (toolbox_slow: --seeds × --modes) and/or coding (the built-in coding agent on "
                         "coding tasks: its sync and async of --modes, one seed)")
    ap.add_argument("--quick", action="store_true", help="smoke run: one seed, small sizes")
    ap.add_argument("--report-only", action="store_true", help="render DIR/results.json again without running")
    ap.add_argument("--delay-median", type=float, default=3.0,
                    help="median seconds of a task's environment delay (lognormal, σ 0.7)")
    ap.add_argument("--train-tasks", type=int, default=16, help="training tasks (of the toolbox's 64)")
    ap.add_argument("--eval-tasks", type=int, default=16, help="held-out tasks evaluated (of 64)")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="steps per round (default: every rollout once)")
    ap.add_argument("--batch-size", type=int, default=16, help="samples per step (async: ÷ group size groups)")
    ap.add_argument("--concurrency", type=int, default=8, help="rollouts in flight")
    ap.add_argument("--max-staleness", type=int, default=3, help="async modes' --max-staleness (weight versions)")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--sft-steps", type=int, default=400, help="the warm start's SFT steps")
    ap.add_argument("--model", default=None, help="base model directory (default: build the tiny model)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.train_tasks, args.eval_tasks, args.rounds = "0", 8, 8, 2
        args.batch_size, args.group_size, args.sft_steps, args.delay_median = 8, 2, 60, 0.3
    for flag, given, known in (("--modes", args.modes, MODES), ("--families", args.families, ("toolbox", "coding"))):
        if set(given.split(",")) - set(known):
            ap.error(f"{flag}: unknown {sorted(set(given.split(',')) - set(known))}; use {', '.join(known)}")
    if args.batch_size % args.group_size:
        ap.error("--batch-size must be a multiple of --group-size (async trains whole groups)")
    if args.steps is None:
        args.steps = max(1, args.train_tasks * args.group_size // args.batch_size)
    return args


def main() -> None:
    args = parse_args()
    if not args.report_only:
        run(args)
    report(json.loads((args.out / "results.json").read_text()))


def run(args: argparse.Namespace) -> None:
    """Each family's runs into --out/results.json, saved after each; a run that an earlier one with
    the same sizes left there is kept (a benchmark cut short resumes, or runs in parts: --families,
    --seeds and --modes may differ between the parts)."""
    results_path, results = ledger(args, ("families", "seeds", "modes"), {"toolbox": {}, "coding": {}})
    base = _base_model(args)
    if "toolbox" in args.families.split(","):
        _toolbox(args, base, results, results_path)
    if "coding" in args.families.split(","):
        _coding(args, base, results, results_path)


def ledger(args: argparse.Namespace, parts: tuple[str, ...], empty: dict) -> tuple[Path, dict]:
    """--out/results.json and the runs it holds when they were made with the same settings but for
    `parts` (the flags that choose which runs, not how each runs); else `empty`."""
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "report_only"}
    results = {"args": settings, **empty}
    if results_path.is_file():
        old = json.loads(results_path.read_text())
        if {k: v for k, v in old["args"].items() if k not in parts} == {k: v for k, v in settings.items()
                                                                         if k not in parts}:
            results = {**old, "args": settings}
    return results_path, results


def _toolbox(args: argparse.Namespace, base: str, results: dict, results_path: Path) -> None:
    modes = args.modes.split(",")
    tasks_file, warm = _toolbox_setup(args, base)
    for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
        order = modes[i % len(modes):] + modes[:i % len(modes)]  # load drifts: no mode always first
        for mode in order:
            key = f"{mode}/{seed}"
            if key in results["toolbox"]:
                continue
            results["toolbox"][key] = _loop(args, args.out / "toolbox" / f"{mode}-{seed}", mode, seed, [
                "--harness", "toolbox_slow", "--tasks", str(tasks_file), "--model", str(warm),
                "--eval-fraction", f"{args.eval_tasks / (args.train_tasks + args.eval_tasks):.6f}"],
                args.concurrency, args.eval_tasks)
            results_path.write_text(json.dumps(results, indent=2))


def _loop(args: argparse.Namespace, out: Path, mode: str, seed: int, harness: list[str], concurrency: int,
          n_eval: int, extra: tuple[str, ...] = (), train_yaml: str = "", launch: Launch | None = None) -> dict:
    """One `harnessrl loop` process in `mode`, timed; its figures (async_stats.measure). `train_yaml`:
    trainer options of every mode (the mode's own added); `launch`: a command prefix and environment
    (bench/async_real.py pins the loop to cores with them)."""
    import os
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "harnessrl", "loop", *harness, "--out", str(out), "--algo", "grpo",
           "--rounds", str(args.rounds), "--group-size", str(args.group_size), "--steps", str(args.steps),
           "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--temperature", str(args.temperature),
           "--seed", str(seed), "--concurrency", str(concurrency), *extra]
    if mode != "sync":
        cmd += ["--async", "--groups-per-step", str(args.batch_size // args.group_size), "--push-every", "1",
                "--max-staleness", str(0 if mode == "async-s0" else args.max_staleness), "--eval-every", str(args.steps)]
    train_yaml += CORRECTIONS.get(mode, "")
    if train_yaml:
        (out / "train.yaml").write_text(train_yaml)
        cmd += ["--train-config", str(out / "train.yaml")]
    prefix, env = launch or ([], {})
    print(f"{out.name}: {' '.join(prefix + cmd[3:])}", flush=True)
    t0 = time.time()
    with open(out / "log.txt", "w") as log:
        rc = subprocess.call(prefix + cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})
    t1 = time.time()
    if rc:
        raise SystemExit(f"{out.name}: exit {rc}, see {out / 'log.txt'}")
    figures = {**measure(out, concurrency, n_eval), "process_wall_s": t1 - t0, "seed": seed, "bench_mode": mode}
    print(f"{out.name}: wall {figures['wall_s']:.0f} s, trainer idle {figures['trainer_idle']:.2f}, "
          f"held-out {figures['held_out']:.3f}", flush=True)
    return figures


def _base_model(args: argparse.Namespace) -> str:
    from learning_warm import base_model

    return base_model(argparse.Namespace(model=args.model, hidden=128, layers=4, out=args.out, warm_cache=None))


def _toolbox_setup(args: argparse.Namespace, base: str) -> tuple[Path, Path]:
    """The tasks file (RL's training tasks, then the evaluated held-out ones: the loop holds out
    the file's tail) and the warm start (bench/learning.py's inconsistent expert and copy drill),
    both of task seed 0 and shared by every seed's runs: a seed is the loop's (its task order,
    sampling, training worlds and initialisation), and one warm start instead of one per seed
    saves an SFT of tens of minutes on the shared 2 cores. Fitted once per settings, reused."""
    seed = TASK_SEED
    from learning import rl_tasks, sft_share, warm_start_rows
    from learning_warm import warm_start

    from harnessrl.harness_examples.toolbox import slow
    from harnessrl.harness_examples.toolbox import tasks as toolbox
    from harnessrl.trainer.sft import SftConfig, sft

    train, held = slow.generate(seed, median_s=args.delay_median)
    tasks_file = slow.write(rl_tasks(train, args.train_tasks) + held[:args.eval_tasks],
                            args.out / f"tasks-{seed}.jsonl")
    expert = argparse.Namespace(confuse="color:size,size:owner,owner:city,city:color", expert_traces=5,
                                expert_right=2, copy_drill=1)
    rows = warm_start_rows(sft_share(train, 32), toolbox.world(seed), expert)
    rows_file = args.out / f"sft-{seed}.jsonl"
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = time.perf_counter()
    warm = warm_start(args.out / f"warm-{seed}", SftConfig(tasks=str(rows_file), model=base, out="",
                                                           steps=args.sft_steps, lr=1e-3, seed=seed), sft)
    print(f"seed {seed}: warm start ready in {time.perf_counter() - t:.0f} s", flush=True)
    return tasks_file, warm


def _coding(args: argparse.Namespace, base: str, results: dict, results_path: Path) -> None:
    """Sync vs async with the built-in coding agent: generated coding tasks (4 training × group 2,
    4 held out; the quick run 2 and 2), 2 rounds of 2 steps of half the round's samples, sandboxed,
    hidden tests as the reward, on the tiny base model (it learns nothing here: this is about
    time, not success)."""
    n = 2 if args.quick else 4
    tasks_dir = args.out / "coding-tasks"
    if not (tasks_dir / "coding.jsonl").is_file():
        subprocess.run([sys.executable, "-m", "harnessrl", "tasks", "coding", "--out", str(tasks_dir), "--n-train",
                        str(n), "--n-eval", str(n), "--seed", "0", "--salt", "async-bench"], check=True,
                       stdout=subprocess.DEVNULL)
    coding = argparse.Namespace(**{**vars(args), "group_size": 2, "batch_size": n, "steps": 2,
                                   "rounds": 2})
    agent = f"{shlex.quote(sys.executable)} -m harnessrl.harness_examples.coding.agent {{task}} --max-turns 3 --max-tokens 48"
    harness = ["--cmd", agent,
               "--tasks", str(tasks_dir / "coding.jsonl"), "--n-tasks", str(2 * n), "--eval-fraction", "0.5",
               "--model", base]
    for mode in (m for m in ("sync", "async") if m in args.modes.split(",")):
        key = f"{mode}/0"
        if key not in results["coding"]:
            results["coding"][key] = _loop(coding, args.out / "coding" / mode, mode, 0, harness, 2, n,
                                           ("--sandbox", "bwrap", "--timeout", "300"))
            results_path.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
