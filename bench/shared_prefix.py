"""Shared-prefix training against today's trainer on the same samples: tokens computed, step time
and memory of one optimizer step (grpo, every sample in the step), with `shared_prefix` on and off.
docs/benchmarks.md › Shared prefixes.

    python bench/shared_prefix.py demo --samples DIR [--model DIR]   # a compiled round of `harnessrl demo --tiny`
    python bench/shared_prefix.py tools --model SMOLLM2_DIR          # the assistant family, 1 task × group 8
    python bench/shared_prefix.py cli [--harnesses claude-code,codex] # the harness suite's real CLI sessions

`demo` trains `--model` (default: the samples' own demo model, DIR/../../warm-model) on a compiled
round. `tools` records a group of 8 rollouts of one assistant task with the real model through the
proxy's local backend, compiles them and trains on them. `cli` runs each real CLI of the harness
suite (tests/harness_cli.py: a scripted upstream, every mode of the suite) and trains the tiny
model on the compiled sessions. Each step runs alternately shared and unshared (`--repeats` each
after a warm-up of each), on one torch thread; time is wall time; memory is the bytes autograd
saves for backward (bench/train_step.py), the part of a step's memory that sharing changes."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from train_step import Runner  # noqa: E402


def compile_db(db: Path, out: Path, tokenizer: str) -> Path:
    r = subprocess.run([sys.executable, "-m", "harnessrl", "compile", "--db", str(db), "--out", str(out),
                        "--tokenizer", tokenizer], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"compile failed: {r.stderr.strip()[-500:]}")
    return out


def tools_samples(model: str, tmp: Path, group: int) -> Path:
    """A group of `group` sampled rollouts of the first assistant task, recorded and compiled."""
    from harnessrl.harness_examples.assistant.harness import AssistantConfig, run_rollout
    from harnessrl.harness_examples.assistant.tasks import generate
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    task = generate(0)[0][0]
    with run_proxy(ProxyConfig(db=str(tmp / "runs.db"), backend="local", model=model, port=0, seed=0)) as proxy:
        for k in range(group):
            run_rollout(proxy.url, task, AssistantConfig(temperature=1.0), group_id=task.id, run="bench")
    return compile_db(tmp / "runs.db", tmp / "samples", model)


def cli_samples(harnesses: list[str], tokenizer: str, tmp: Path) -> list[Path]:
    """Each harness's suite session (every mode), compiled by the suite itself."""
    import harness_cli as hc

    out = []
    for name in harnesses:
        (tmp / name).mkdir()
        s = hc.session(name, Path(tokenizer), tmp / name)
        if s["compile"].returncode:
            raise SystemExit(f"{name}: compile failed: {s['compile'].stderr[-500:]}")
        out.append(tmp / name / "samples")
    return out


def measure(model: str, samples: list[Path], repeats: int) -> dict[str, dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harnessrl.trainer.config import TrainConfig
    from harnessrl.trainer.data import Dataset, load_samples
    from harnessrl.trainer.grpo import HarnessTrainer

    loaded = [load_samples(s) for s in samples]
    data = Dataset([x for d in loaded for x in d.samples], {k: v for d in loaded for k, v in d.tasks.items()})
    n = len(data.samples)
    runners, out = {}, {}
    for shared in (False, True):
        cfg = TrainConfig(samples=str(samples[0]), model=model, out=tempfile.mkdtemp(), steps=repeats + 2, batch_size=n,
                          lr=1e-7, report_to="none", shared_prefix=shared).validate()
        torch.manual_seed(0)
        tr = HarnessTrainer(AutoModelForCausalLM.from_pretrained(model), cfg, data, AutoTokenizer.from_pretrained(model))
        batch = tr.fixed_batch()  # every sample in one micro-batch
        name = "shared" if shared else "unshared"
        out[name] = {"samples": n, "tokens": sum(len(s.input_ids) for s in data.samples),
                     "computed": batch["packed"].tokens}
        runners[name] = Runner(tr, batch, repeats + 2, time.perf_counter)
    for r in range(repeats + 1):
        for runner in runners.values():
            runner.step(record=r >= 1)
    for name, runner in runners.items():
        out[name].update(step_s=statistics.median(runner.times), saved_mib=runner.mem / 2**20)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("set", choices=("demo", "tools", "cli"))
    ap.add_argument("--samples", type=Path, help="demo: a compiled samples directory")
    ap.add_argument("--model", help="model directory (tools: the real model; cli: default the tiny model)")
    ap.add_argument("--group", type=int, default=8, help="tools: rollouts of the task")
    ap.add_argument("--harnesses", default="claude-code,codex", help="cli: harnesses of the suite")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-shared-"))
    if a.set == "demo":
        if a.samples is None:
            raise SystemExit("demo: --samples DIR (a round's samples under `harnessrl demo --tiny`'s demo/loop/round-*/samples)")
        model = a.model or str(a.samples.resolve().parents[2] / "warm-model")
        samples = [a.samples]
    elif a.set == "tools":
        if a.model is None:
            raise SystemExit("tools: --model DIR (the real model: harnessrl smollm2 DIR)")
        model, samples = a.model, [tools_samples(a.model, tmp, a.group)]
    else:
        from harnessrl.tiny_model import build_tiny_model

        model = a.model or str(build_tiny_model(tmp / "tiny"))
        samples = cli_samples(a.harnesses.split(","), model, tmp)
    r = measure(model, samples, a.repeats)
    u, s = r["unshared"], r["shared"]
    print(f"{a.set}: {u['samples']} samples, {u['tokens']} tokens; model {model}")
    print("| | tokens computed | step s | saved for backward MiB |\n|---|---|---|---|")
    for name in ("unshared", "shared"):
        x = r[name]
        print(f"| {name} | {x['computed']} | {x['step_s']:.3f} | {x['saved_mib']:.1f} |")
    print(f"| shared ÷ unshared | {s['computed'] / u['computed']:.3f} | {s['step_s'] / u['step_s']:.3f} | "
          f"{s['saved_mib'] / u['saved_mib']:.3f} |")


if __name__ == "__main__":
    main()
