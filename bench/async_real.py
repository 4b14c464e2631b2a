"""Async on the real model (issue 55 §2, §3): `harnessrl loop --async` against the round loop with
SmolLM2-135M-Instruct, rollouts served by vLLM's CPU build, in two core layouts, and the off-policy
corrections side by side.

The real-model demo's setting (harnessrl/app/demo_config.py REAL): the assistant family's tasks of
seed 0 (`--train-tasks` training, `--eval-tasks` held out), the warm start of 20 SFT steps on the
inconsistent expert, GRPO at lr 2e-5, temperature 1, one micro-batch a step. The model is
converted untied (`harnessrl smollm2 --vllm`: vLLM's reload leaves a tied output layer behind),
served by `harnessrl vllm --dtype float32` (the trainer's numerics, so that the mismatch metrics
measure staleness, not a dtype), and reset to the warm start before every run (a push straight
to vLLM). Per layout one server; per seed and mode one `harnessrl loop --upstream` process, timed
as bench/async_loop.py times its runs (bench/async_stats.py):

- `free`: as is on the 2 cores: vLLM's default thread binding, the loop's torch on 2 threads;
- `pinned`: the trainer and the inference server on separate cores, as on separate GPUs: vLLM under
  `taskset -c 1` with its OpenMP threads bound to core 1 (`VLLM_CPU_OMP_THREADS_BIND=1`), the loop
  (trainer, proxy, harness threads) under `taskset -c 0` with one torch thread.

Modes: `sync` (the round loop), `async` (the default correction: token-level truncated IS at C 2),
`async-plain` (no correction: the plain unclipped ratio to the behaviour policy), and the other
corrections of docs/methods.md §6.5: `async-seq` (sequence-level truncated IS), `async-mask`
(token-level masked IS, band [0, 2]), `async-icepop` (two-sided token mask, band [0.5, 5]).

    python bench/async_real.py --out bench-out/async-real                  # 3 seeds × sync, async, async-plain × 2 layouts
    python bench/async_real.py --out bench-out/async-real --layouts pinned --seeds 0 \\
        --modes async-seq,async-mask,async-icepop                          # the corrections
    python bench/async_real.py --report-only --out bench-out/async-real
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import async_loop  # noqa: E402
from async_report import report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CORRECTIONS = {"async-seq": "tis: true\ntis_level: sequence\n", "async-mask": "tis: true\ntis_mode: mask\n",
               "async-icepop": "tis: true\ntis_mode: icepop\n"}
MODES = ("sync", "async", "async-plain", *CORRECTIONS, "async-s0")
LAYOUTS = {  # vLLM's prefix and environment, the loop's
    "free": ([], {}, [], {"OMP_NUM_THREADS": "2"}),
    "pinned": (["taskset", "-c", "1"], {"VLLM_CPU_OMP_THREADS_BIND": "1"}, ["taskset", "-c", "0"],
               {"OMP_NUM_THREADS": "1"}),
}
SERVED = "smollm2"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench-out/async-real"))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--modes", default="sync,async,async-plain", help="of " + ", ".join(MODES))
    ap.add_argument("--layouts", default="free,pinned", help="of " + ", ".join(LAYOUTS))
    ap.add_argument("--report-only", action="store_true", help="render DIR/results.json again without running")
    ap.add_argument("--train-tasks", type=int, default=16, help="training tasks (of the family's 72)")
    ap.add_argument("--eval-tasks", type=int, default=16, help="held-out tasks evaluated (of 36)")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="steps per round (default: every rollout once)")
    ap.add_argument("--batch-size", type=int, default=16, help="samples per step (async: ÷ group size groups)")
    ap.add_argument("--concurrency", type=int, default=8, help="rollouts in flight")
    ap.add_argument("--max-staleness", type=int, default=3, help="async modes' --max-staleness (weight versions)")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--sft-steps", type=int, default=20, help="the warm start's SFT steps (lr 5e-5)")
    ap.add_argument("--port", type=int, default=8011, help="vLLM's port")
    args = ap.parse_args(argv)
    for flag, given, known in (("--modes", args.modes, MODES), ("--layouts", args.layouts, LAYOUTS)):
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
    """Each layout's runs into --out/results.json, saved after each; runs of the same sizes already
    there are kept (the benchmark resumes, or runs in parts)."""
    async_loop.CORRECTIONS.update(CORRECTIONS)
    results_path, results = async_loop.ledger(args, ("layouts", "seeds", "modes"), {})
    tasks_file, warm = setup(args)
    budget = "max_tokens_per_microbatch: 32768\n"  # one micro-batch a step, as the real demo (demo_config.REAL)
    harness = ["--harness", "assistant", "--tasks", str(tasks_file), "--model", str(warm),
               "--n-tasks", str(args.train_tasks + args.eval_tasks),
               "--eval-fraction", f"{args.eval_tasks / (args.train_tasks + args.eval_tasks):.6f}"]
    modes = args.modes.split(",")
    for layout in args.layouts.split(","):
        todo = [(seed, m) for i, seed in enumerate(int(s) for s in args.seeds.split(","))
                for m in modes[i % len(modes):] + modes[:i % len(modes)]  # no mode always first
                if f"{m}/{seed}" not in results.get(layout, {})]
        if not todo:
            continue
        vllm_prefix, vllm_env, loop_prefix, loop_env = LAYOUTS[layout]
        with vllm(warm, args.port, vllm_prefix, vllm_env, args.out / f"vllm-{layout}.log") as url:
            for seed, mode in todo:
                reset(url, warm, f"warm-{layout}-{mode}-{seed}")
                figures = async_loop._loop(args, args.out / layout / f"{mode}-{seed}", mode, seed,
                                           harness + ["--upstream", url], args.concurrency, args.eval_tasks,
                                           train_yaml=budget, launch=(loop_prefix, loop_env))
                results.setdefault(layout, {})[f"{mode}/{seed}"] = {**figures, "layout": layout}
                results_path.write_text(json.dumps(results, indent=2))
                for weights in (*(args.out / layout).glob(f"{mode}-{seed}/**/model.safetensors"),
                                *(args.out / layout).glob(f"{mode}-{seed}/**/optimizer.pt")):
                    weights.unlink()  # 5 GB a run (a checkpoint a step); its records and state stay


def setup(args: argparse.Namespace) -> tuple[Path, Path]:
    """The tasks file and the warm start (untied SmolLM2, the demo's SFT), made once per --out."""
    from harnessrl.app.demo import demo_tasks
    from harnessrl.app.demo_config import REAL
    from harnessrl.smollm2 import build_smollm2
    from harnessrl.trainer.sft import SftConfig, sft

    base, warm = args.out / "smollm2-untied", args.out / f"warm-{args.sft_steps}"
    if not (base / "config.json").is_file():
        build_smollm2(base, untie=True)
    tasks_file, sft_file, n_train, n_held = demo_tasks(REAL, args.out)
    if (args.train_tasks, args.eval_tasks) != (n_train, n_held):
        raise SystemExit(f"the demo's task set has {n_train} + {n_held} tasks; give --train-tasks {n_train} "
                         f"--eval-tasks {n_held}")
    if not (warm / "config.json").is_file():
        t = time.perf_counter()
        sft(SftConfig(tasks=str(sft_file), model=str(base), out=str(warm), steps=args.sft_steps, lr=REAL.sft_lr,
                      seed=0))
        print(f"warm start ready in {time.perf_counter() - t:.0f} s", flush=True)
    return tasks_file, warm


@contextmanager
def vllm(model: Path, port: int, prefix: list[str], env: dict[str, str], log: Path):
    """`harnessrl vllm MODEL` under `prefix` (a core layout), up until the block ends."""
    cmd = [*prefix, str(Path(sys.executable).with_name("harnessrl")), "vllm", str(model), "--port", str(port),
           "--served-model-name", SERVED, "--dtype", "float32", "--seed", "0"]
    print(f"vllm: {' '.join(cmd)} ({env})", flush=True)
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"vllm exited ({proc.returncode}) while starting: see {log}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > 600:
                raise SystemExit(f"vllm did not answer /health in 600 s: see {log}")
            time.sleep(2)
        print(f"vllm up in {time.monotonic() - t0:.0f} s", flush=True)
        yield url
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(60)


def reset(url: str, warm: Path, version: str) -> None:
    """The warm start's weights back into vLLM, so every run starts from them."""
    from harnessrl.trainer.push import push_vllm

    push_vllm(url, warm, version, lora=False)


if __name__ == "__main__":
    main()
