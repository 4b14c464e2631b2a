"""Peak memory and step time of one training step against sample length (issue 33).

    python bench/long_sessions.py [--model DIR] [--lengths 4096,16384,40960,102400] [--shape tiny|0.5b]

Each length runs in its own process (a fresh peak): one sample of that many tokens, a synthetic
coding-CLI session (tests/trainer_fixtures.session_rows: tool schemas, then tool-call turns and
tool results) through the compiler's sample format, trained for 2 steps of batch 1 by
HarnessTrainer (grpo; packed rows; activation checkpointing at every length unless
--checkpointing auto: the trainer's default, on from 8192 tokens). Step time: the
second step (the first warms up). Memory: on CPU the process's peak RSS over its RSS before
training (the interpreter, torch, the model); on a GPU the peak allocated CUDA memory over the
weights. The slope is a least-squares fit of that memory against tokens: linear memory means a
constant per-token cost, a full score matrix would grow with the square of the length.

--shape 0.5b: a randomly initialised Qwen2 of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14
heads, vocabulary 151936; bf16), built in memory (no weights are downloaded), with the tiny
model's tokenizer; meant for a GPU (it runs on CPU too, slowly). Default: the tiny test model."""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SHAPE_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, max_position_embeddings=131072, tie_word_embeddings=True)


def one(model_dir: str, shape: str, tokens: int, work: Path, checkpointing: bool | None) -> dict:
    """Train one sample of `tokens` tokens for 2 steps in this process; measure the second."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, TrainerCallback

    from harnessrl.trainer.config import TrainConfig
    from harnessrl.trainer.data import load_samples
    from harnessrl.trainer.grpo import HarnessTrainer
    from trainer_fixtures import session_rows, write_samples

    cuda = torch.cuda.is_available()
    tok = AutoTokenizer.from_pretrained(model_dir)
    samples = write_samples(work / f"s{tokens}", session_rows(tok, tokens, 1))
    if shape == "0.5b":
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPE_05B)).to(torch.bfloat16)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
    cfg = TrainConfig(samples=str(samples), model=model_dir, out=str(work / "out"), steps=2, batch_size=1, lr=1e-6,
                      report_to="none", bf16=shape == "0.5b" and cuda, gradient_checkpointing=checkpointing).validate()

    class Clock(TrainerCallback):
        marks: list[float] = []

        def on_step_begin(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            Clock.marks.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            Clock.marks.append(time.perf_counter())

    tr = HarnessTrainer(model, cfg, load_samples(samples), tok, callbacks=[Clock()], trl_args=dict(disable_tqdm=True))
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tr.train()
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"tokens": tokens, "device": "cuda" if cuda else "cpu", "memory": peak - before, "peak": peak,
            "step_s": Clock.marks[3] - Clock.marks[2], "checkpointing": bool(tr.args.gradient_checkpointing),
            "micro": tr.plan.micro, "budget": tr.budget}


def slope(rows: list[dict]) -> tuple[float, float]:
    """Least-squares memory = a + b·tokens: (b in bytes per token, a in bytes)."""
    xs, ys = [r["tokens"] for r in rows], [r["memory"] for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(sum((x - mx) ** 2 for x in xs), 1e-9)
    return b, my - b * mx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model (and tokenizer) directory (default: build the tiny test model)")
    ap.add_argument("--lengths", default="4096,16384,40960,102400")
    ap.add_argument("--shape", choices=("tiny", "0.5b"), default="tiny", help="0.5b: random Qwen2.5-0.5B shape, tokenizer from --model")
    ap.add_argument("--checkpointing", choices=("on", "off", "auto"), default="on",
                    help="activation checkpointing at every length (default on: one regime, a clean slope); auto: the trainer's default")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per length")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # the per-length worker
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-long-"))
    if a.one is not None:
        checkpointing = {"on": True, "off": False, "auto": None}[a.checkpointing]
        Path(a.out).write_text(json.dumps(one(a.model, a.shape, a.one, work, checkpointing)))
        return
    if a.model is None:
        from harnessrl.tiny_model import build_tiny_model

        a.model = str(build_tiny_model(work / "tiny"))  # minutes on a slow CPU: pass --model to reuse one
    rows = []
    for n in (int(x) for x in a.lengths.split(",")):
        out = work / f"r{n}.json"
        cmd = [sys.executable, __file__, "--model", a.model, "--shape", a.shape, "--checkpointing", a.checkpointing,
               "--one", str(n), "--out", str(out)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            print(f"{n} tokens: over {a.timeout} s, stopped")
            break
        if r.returncode != 0 or not out.is_file():
            print(f"{n} tokens: failed (exit {r.returncode})\n{r.stderr[-2000:]}")
            break
        rows.append(json.loads(out.read_text()))
        print(json.dumps(rows[-1]), flush=True)
    if not rows:
        return
    unit = "CUDA allocated" if rows[0]["device"] == "cuda" else "RSS"
    print(f"\n| tokens | step s | peak {unit} MiB | over start MiB | KiB/token | checkpointing |")
    print("|---:|---:|---:|---:|---:|:---:|")
    for r in rows:
        print(f"| {r['tokens']} | {r['step_s']:.1f} | {r['peak'] / 2**20:.0f} | {r['memory'] / 2**20:.0f} | "
              f"{r['memory'] / r['tokens'] / 1024:.1f} | {'on' if r['checkpointing'] else 'off'} |")
    if len(rows) > 1:
        b, c = slope(rows)
        worst = max(abs(r["memory"] - (c + b * r["tokens"])) for r in rows)
        print(f"\nslope {b / 1024:.1f} KiB/token, intercept {c / 2**20:.0f} MiB; largest deviation from the line "
              f"{worst / 2**20:.0f} MiB ({rows[0]['device']}, shape {a.shape})")


if __name__ == "__main__":
    main()
