"""Learning benchmark: can RL through harnessrl lift a warm-started policy on held-out tasks, and
do the algorithms differ?

Task family: toolbox (harness_examples/toolbox) — choose one of four attribute tools (action) and
fill its item argument (args); the episode ends at the first tool call that runs, its result
being the answer, so success is exactly the right tool with the right item. 64 training and 64
held-out tasks per seed, held-out ones being new tool × item combinations; RL trains on
`--train-tasks` of the training ones (32: one per item, `rl_tasks`); each training round
draws a fresh world (values), so a remembered value never pays, and the evaluation keeps the
seed's world. `--delegate`: the same behind a planner that must ask a worker. `--prompt compact`
(default): the toolbox's short prompt (210 tokens instead of 341; every SFT, rollout and training
step of this tiny model costs by the prompt's length).

The warm start imitates an inconsistent expert (`--confuse`; default a cycle, color → size → owner
→ city → color): each training task is in its data `--expert-traces` times (5), and only
`--expert-right` (2) of those lines call the asked attribute's tool, the others the tool it is
confused with. A policy fitted on that keeps the mix for each question (it cannot remember which
line a task had): greedy it mostly calls the confused tool, on held-out tasks as on training ones,
while sampling finds the right one about two times in five. Lifting that is what RL from an
outcome reward is for, and what it can carry to held-out tasks (a rule of the question's attribute
word, not of a task). Its data also holds a copy drill (`find(item)` over every item,
`--copy-drill`): the tiny model has no pretrained copying, and without it the warm start writes an
item remembered with the tool, wrong on almost every held-out combination whatever the tool
(docs/changelog.md has the runs that showed it). `--confuse none` is a faithful
expert (then `--sft-items`/`--sft-others`, `sft_share`, choose what it was fitted on).

Per seed: one SFT warm start (the same for every algorithm; reused from an earlier run in the same
--out); from it, each algorithm runs `harnessrl loop` with the same rounds, group, sampling
temperature, optimizer steps (default: every rollout once), batch size, learning rate and trainer
options (`--ratio-to`, `--beta`, `--negative-weight`): the same compute; greedy evaluation on the
64 held-out tasks before and after. Reported: mean over seeds with a 95% interval (Wilson, over the
pooled seed × task outcomes) of held-out success and tool-call validity, before and after; verdicts
of each algorithm against the warm start and of each pair of algorithms (apart only when the
intervals do not overlap), and the same paired by seed (a t-interval of the per-seed differences,
which holds the spread between seeds that the pooled intervals do not; `learning_stats.py`); the
same for the two skills apart, the first call's tool (action) and item (args); a plot. Everything
reported is read back from --out/results.json, so `--report-only` renders it again without
training.

    python bench/learning.py --jobs 2                          # full: 6 seeds × 4 algorithms, two seeds at a time
    python bench/learning.py --seeds 0 --algos grpo --rounds 1 # reduced
    python bench/learning.py --expert-right 1 --algos grpo,pact  # sparse reward: 1 right line of 5
    python bench/learning.py --delegate --algos grpo,matpo     # planner → worker
    python bench/learning.py --report-only --out DIR           # table, verdicts, plot from DIR/results.json
    python bench/learning.py --family capo-multihop --eval-on validation --algos grpo,capo --seeds 0 --out DIR

`--family` (learning_families.py) picks the task family where one paper's effect can show:
capo-multihop, matpo-delegate (with `--single-agent` algorithms on the same tasks as one agent),
pact-sparse; `--eval-on validation` evaluates on the training side's tasks RL does not train on
(for choosing a tuning grid's point), `held-out` (default) on the held-out ones.

The defaults (4-layer tiny model, compact prompt, 1,000 SFT steps; RL on 32 tasks × group 8,
3 rounds of 8 steps × 32 samples) run 6 seeds × 4 algorithms in under an hour on 2 cores
(`--jobs 2`; docs/benchmarks.md › Learning has the run). The earlier configuration (full prompt,
64 tasks, 4 rounds) took 84 min for 3 seeds: `--prompt full --train-tasks 64 --rounds 4`. A
2-layer model's warm starts mostly lack the copy skill (docs/changelog.md).

"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from harnessrl.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
import learning_families as families  # noqa: E402
from learning_warm import base_model, warm_start  # noqa: E402
from learning_report import PARTS, report  # noqa: E402


def main() -> None:
    args = parse_args()
    if not args.report_only:
        _train_parallel(args) if "," in args.seeds else _train(args)
    report(args.out, Console())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench-out/learning"))
    ap.add_argument("--report-only", action="store_true",
                    help="re-render the table, verdicts and plot from --out/results.json without training")
    ap.add_argument("--algos", default="grpo,capo,matpo,pact")
    ap.add_argument("--seeds", default="0,1,2,3,4,5")
    ap.add_argument("--family", choices=families.FAMILIES, default="toolbox",
                    help="task family (bench/learning_families.py): toolbox, or the one where a paper's effect can "
                         "show: capo-multihop, matpo-delegate, pact-sparse")
    ap.add_argument("--eval-on", choices=("validation", "held-out"), default="held-out",
                    help="what is evaluated: the held-out tasks, or the validation split (the training side's "
                         "tasks RL does not train on) for choosing a tuning grid's point")
    ap.add_argument("--single-agent", default="grpo",
                    help="matpo-delegate: the algorithms run as one agent on the same tasks (the paper's baseline)")
    ap.add_argument("--delegate", action="store_true", help="planner → worker variant of the toolbox family")
    ap.add_argument("--prompt", choices=("compact", "full"), default="compact",
                    help="the toolbox prompt: compact (short system text, tool schemas of a name and a parameter: "
                         "210 tokens) or full (with descriptions: 341)")
    ap.add_argument("--model", default=None, help="base model directory (default: build the tiny model)")
    ap.add_argument("--hidden", type=int, default=128, help="tiny model width when building it")
    ap.add_argument("--layers", type=int, default=4, help="tiny model depth when building it")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--group-size", type=int, default=8,
                    help="rollouts per training task per round (loop --group-size)")
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of the training rollouts")
    ap.add_argument("--sft-steps", type=int, default=1000)
    ap.add_argument("--sft-lr", type=float, default=1e-3)
    ap.add_argument("--confuse", default="color:size,size:owner,owner:city,city:color",
                    help="the warm start's expert mixes up these tools, asked:called pairs (none: a faithful expert)")
    ap.add_argument("--expert-traces", type=int, default=None,
                    help="expert lines per training task (default: the family's, 5; two-hop families 7)")
    ap.add_argument("--expert-right", default=None,
                    help="of them, how many call the right tool where the expert confuses it (default: the family's: "
                         "toolbox 2, pact-sparse 0; two-hop families per hop, relation,attribute: 3,5)")
    ap.add_argument("--copy-drill", type=int, default=1,
                    help="times the copy drill (find(item) over every item, two phrasings) is in the warm start's data")
    ap.add_argument("--sft-items", type=int, default=32,
                    help="items both of whose training tasks the warm start is fitted on (of 32; 32: all, and "
                         "RL then has only tasks the warm start was fitted on)")
    ap.add_argument("--sft-others", choices=("one", "none"), default="one",
                    help="what the warm start sees of the other items: the first of their training tasks "
                         "(one), or nothing (none: RL then has items the warm start never wrote)")
    ap.add_argument("--train-tasks", type=int, default=32,
                    help="RL's training tasks (of 64): the first of every item's two, then the seconds (rl_tasks)")
    ap.add_argument("--steps", type=int, default=None,
                    help="optimizer steps per round (default: group × train tasks / batch size, every rollout once)")
    ap.add_argument("--batch-size", type=int, default=32, help="samples per optimizer step")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--ratio-to", choices=("behaviour", "round", "step"), default="behaviour",
                    help="logp_old of the clipped ratio (trainer option ratio_to, docs/methods.md §6; pact: round "
                    "where behaviour is asked)")
    ap.add_argument("--beta", type=float, default=None, help="KL coefficient (trainer default when unset)")
    ap.add_argument("--negative-weight", type=float, default=1.0,
                    help="scale of negative advantages (trainer option negative_weight; 1: the methods' loss)")
    ap.add_argument("--jobs", type=int, default=2,
                    help="seeds trained at once, each in its own process with the cores split between them")
    ap.add_argument("--warm-cache", type=Path, default=None,
                    help="keep the base model and the warm starts here, shared by runs with other --out (each built "
                         "once, under a lock: bench/fair.py runs one process per algorithm, lr and seed)")
    args = ap.parse_args(argv)
    families.fill_defaults(args)
    if args.steps is None:
        args.steps = max(1, args.group_size * args.train_tasks // args.batch_size)
    return args


def _settings(args: argparse.Namespace) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
            if k not in ("report_only", "jobs", "warm_cache")}


def _train_parallel(args: argparse.Namespace) -> None:
    """Several seeds: this script once per seed (--jobs N at a time) on one base model, each into
    --out/seed-S (its log there), then their results as one --out/results.json. A seed whose
    results an earlier run with the same settings left there is kept, not trained again (a run
    cut short resumes; its wall time then counts only this run's part, and `reused` names them)."""
    import os
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    t_all = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    base = base_model(args)
    own = ("out", "seeds", "model", "jobs", "report_only", "delegate")
    flags = [f for k, v in vars(args).items() if k not in own and v is not None for f in (f"--{k.replace('_', '-')}", str(v))]
    flags += ["--delegate"] if args.delegate else []
    # the cores split between the jobs (one torch thread each on 2 cores: with other processes
    # running, 2 threads made a step ~3× slower), unless the caller set it
    env = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // args.jobs)), **os.environ}
    mine = {k: v for k, v in _settings(args).items() if k not in ("seeds", "model", "out")}
    reused = []

    def one(seed: str) -> dict:
        where = args.out / f"seed-{seed}"
        done = where / "results.json"
        if done.is_file():
            old = json.loads(done.read_text())
            if {k: v for k, v in old["args"].items() if k not in ("seeds", "model", "out")} == mine:
                reused.append(int(seed))
                return old
        where.mkdir(parents=True, exist_ok=True)
        with open(where / "log.txt", "w") as log:
            rc = subprocess.call([sys.executable, __file__, *flags, "--seeds", seed, "--model", base, "--out", str(where)],
                                 stdout=log, stderr=subprocess.STDOUT, env=env)
        if rc:
            raise SystemExit(f"seed {seed}: exit {rc}, see {where / 'log.txt'}")
        return json.loads((where / "results.json").read_text())

    with ThreadPoolExecutor(args.jobs) as pool:
        parts = list(pool.map(one, args.seeds.split(",")))
    runs = {algo: [r for p in parts for r in p["runs"][algo]] for algo in parts[0]["runs"]}
    _write_results(args.out / "results.json", {**parts[0], "args": _settings(args), "runs": runs,
                                               "wall_s": time.perf_counter() - t_all, "reused": sorted(reused)})


def _train(args: argparse.Namespace) -> None:
    """Warm starts and loops; writes --out/results.json."""
    from harnessrl.app.loop.config import LoopConfig
    from harnessrl.app.loop.sync import run_loop
    from harnessrl.trainer.sft import SftConfig, sft

    console = Console()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    base = base_model(args)
    console.print(f"base model ready in {time.perf_counter() - t_all:.0f} s")
    harness = ""
    algos, seeds = args.algos.split(","), [int(s) for s in args.seeds.split(",")]
    runs: dict[str, list[dict]] = {a: [] for a in algos}

    n_eval = 0
    for seed in seeds:
        sides = {False: _setup(args, seed, False)}
        if args.family == "matpo-delegate" and set(algos) & set(args.single_agent.split(",")):
            sides[True] = _setup(args, seed, True)
        harness = sides[False][0].harness  # the family's (the single-agent side's is named per run)
        for single, (fam, tasks_file, eval_tasks) in sides.items():
            n_eval = len(eval_tasks)
            rows_file = out / f"sft-{seed}{'-single' * single}.jsonl"
            rows_file.write_text("".join(json.dumps(r) + "\n" for r in fam.rows))
            t = time.perf_counter()
            home = args.warm_cache / args.family if args.warm_cache else out
            warm = warm_start(home / f"warm-{seed}{'-single' * single}",
                               SftConfig(tasks=str(rows_file), model=base, out="", steps=args.sft_steps,
                                         lr=args.sft_lr, seed=seed), sft)
            sides[single] = (fam, tasks_file, eval_tasks, warm)
            console.print(f"seed {seed}: warm start{' (single agent)' * single} ({args.sft_steps} SFT steps) in "
                          f"{time.perf_counter() - t:.0f} s")
        for algo in algos:
            single = algo in args.single_agent.split(",") and True in sides
            fam, tasks_file, eval_tasks, warm = sides[single]
            t = time.perf_counter()
            shutil.rmtree(out / f"{algo}-{seed}", ignore_errors=True)
            train_config = _train_options(out / f"train-{algo}.yaml", algo, args)
            n_rl = min(args.train_tasks, len(fam.train))
            state = run_loop(LoopConfig(harness=fam.harness, algo=algo, rounds=args.rounds, group=args.group_size,
                                        model=str(warm), out=out / f"{algo}-{seed}", steps=args.steps,
                                        batch_size=args.batch_size, lr=args.lr, temperature=args.temperature,
                                        seed=seed, train_config=train_config, tasks=tasks_file,
                                        eval_fraction=len(eval_tasks) / (n_rl + len(eval_tasks))),
                             Console(quiet=True))
            last = state.rounds[-1]
            runs[algo].append({"seed": seed, "before": state.initial_eval, "after": last["eval_success"],
                               "validity_before": state.initial_validity, "validity_after": last["eval_validity"],
                               "curve": [r["eval_success"] for r in state.rounds],
                               "train": [r["train_success"] for r in state.rounds],
                               "group_success": [r.get("group_success") for r in state.rounds],
                               "diagnostics": last.get("train_log", {}),
                               "harness": fam.harness, "eval_on": args.eval_on,
                               "seconds": time.perf_counter() - t,
                               "parts_before": {k: state.initial_metrics[k] for k in PARTS},
                               "parts_after": {k: last["eval_metrics"][k] for k in PARTS}})
            console.print(f"seed {seed} {algo}: held-out {state.initial_eval:.3f} → {last['eval_success']:.3f} "
                          f"({time.perf_counter() - t:.0f} s)")
    _write_results(out / "results.json", {"args": _settings(args), "harness": harness, "n_eval": n_eval,
                                          "wall_s": time.perf_counter() - t_all, "runs": runs})
    console.print(f"trained in {time.perf_counter() - t_all:.0f} s")


def _setup(args: argparse.Namespace, seed: int, single: bool) -> tuple:
    """The family's tasks and warm-start lines for `seed`, and the loop's tasks file: RL's tasks
    (`rl_tasks`), then the evaluated ones (held-out, or the validation split: `--eval-on`)."""
    if args.family == "toolbox":
        from harnessrl.harness_examples.toolbox import tasks as toolbox

        train, held = toolbox.generate(seed, args.delegate, compact=args.prompt == "compact")
        rows = warm_start_rows(sft_share(train, args.sft_items, args.sft_others == "one"), toolbox.world(seed), args)
        name = "toolbox_delegate" if args.delegate else "toolbox"
        fam = families.Setup(train, held, rows, toolbox.write, name)
    else:
        fam = families.setup(args, seed, single, lambda train: sft_share(train, args.sft_items,
                                                                         args.sft_others == "one"))
    rl = rl_tasks(fam.train, args.train_tasks)
    eval_tasks = fam.held if args.eval_on == "held-out" else families.validation(fam.train, rl)
    # the loop reads its tasks from this file (RL's subset, the prompt), the evaluated tasks last
    return fam, fam.write(rl + eval_tasks, args.out / f"tasks-{seed}{'-single' * single}.jsonl"), eval_tasks


def _write_results(path: Path, results: dict) -> None:
    """results.json, keeping the runs of other algorithms that an earlier run with the same
    settings left there: a benchmark can be trained in parts on the same warm starts (`--algos
    grpo,capo`, then `--algos matpo,pact`); the wall time is then the parts' sum."""
    if path.is_file():
        old = json.loads(path.read_text())
        if {k: v for k, v in old["args"].items() if k != "algos"} == {k: v for k, v in results["args"].items()
                                                                       if k != "algos"}:
            kept = {a: rs for a, rs in old["runs"].items() if a not in results["runs"]}
            if kept:
                results["runs"] = {**kept, **results["runs"]}
                results["args"]["algos"] = ",".join(results["runs"])
                results["wall_s"] += old.get("wall_s", 0.0)
    path.write_text(json.dumps(results, indent=2))


def _train_options(path: Path, algo: str, args: argparse.Namespace) -> Path:
    """The trainer options beyond the loop's flags, as a --train-config file. PACT takes ratio_to:
    round where behaviour is asked (its trace rows are scored under another context than they were
    sampled in, so the trainer refuses behaviour for it); the round's start is the paper's π_old."""
    ratio_to = "round" if algo == "pact" and args.ratio_to == "behaviour" else args.ratio_to
    path.write_text(f"ratio_to: {ratio_to}\nnegative_weight: {args.negative_weight}\n"
                    + (f"beta: {args.beta}\n" if args.beta is not None else ""))
    return path


def confusions(spec: str) -> dict[str, str]:
    """--confuse "size:color,owner:city" → {"size": "color", "owner": "city"}; "none" → {}."""
    if spec == "none":
        return {}
    try:
        return dict(pair.split(":") for pair in spec.split(","))
    except ValueError:
        raise SystemExit(f"--confuse {spec!r}: give asked:called pairs, e.g. size:color,owner:city, or none") from None


def warm_start_rows(tasks: list, table: dict, args: argparse.Namespace) -> list[dict]:
    """The warm start's SFT lines: the (inconsistent) expert's on `tasks`, and the copy drill."""
    from harnessrl.harness_examples.toolbox import tasks as toolbox

    try:
        rows = toolbox.inconsistent_expert(tasks, table, confusions(args.confuse), args.expert_traces,
                                           int(args.expert_right))
    except ValueError as exc:
        raise SystemExit(f"--confuse/--expert-traces/--expert-right: {exc}") from None
    # the drill's prompt as short as the tasks' (the same schema shape, fewer tokens per step)
    return rows + toolbox.copy_drill(compact=any(t.compact for t in tasks)) * args.copy_drill


def rl_tasks(train: list, n: int) -> list:
    """RL's training tasks: the first training task of every item, then every item's second, the
    first n of that order — with n ≥ 32 every item is in RL's tasks, so a round's groups cover
    every word the held-out tasks use."""
    firsts, seconds, seen = [], [], set()
    for t in train:
        (seconds if t.item in seen else firsts).append(t)
        seen.add(t.item)
    return (firsts + seconds)[:n]


def sft_share(train: list, items: int, others_once: bool = True) -> list:
    """The warm start's tasks: every training task of the first `items` items (in task order),
    and with `others_once` the first training task of every other item.

    Why this split (measured on seed 0): fitted on all 64 training tasks, the warm start solved
    ~96% of its training rollouts (GRPO's advantages almost all zero) and its held-out errors were
    item → tool associations that the training tasks reward as much as reading the question, so
    RL sharpened them. Fitted on 16 items only, it never wrote the other 16 items' names, so their
    groups were all zero. With the others once, every item is written, and for half of them the
    second training task asks an attribute the warm start never saw with that item: there the
    association fails and reading the question pays, which is what held-out tasks need."""
    chosen = set(list(dict.fromkeys(t.item for t in train))[:items])
    out, seen = [], set()
    for t in train:
        if t.item in chosen or (others_once and t.item not in seen):
            out.append(t)
        seen.add(t.item)
    return out


if __name__ == "__main__":
    main()
