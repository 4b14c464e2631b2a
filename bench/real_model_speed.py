"""The real model's speed on this machine: training tokens/s and memory per setting, generation
tokens/s through the proxy on the local backend (and on vLLM's CPU build with --vllm), at 1 and
at 8 concurrent sessions. docs/benchmarks.md › The real model's speed.

    python bench/real_model_speed.py --model DIR [--steps 3] [--rows 8] [--tools 2] [--vllm]

Training: each setting in a process of its own (its peak RSS is the setting's memory), on the
same samples (`--rows` rollouts of two calls each, prompts with `--tools` tool schemas),
`--steps` optimizer steps after one warm-up step; tokens/s = tokens forwarded per second of wall
time. Generation: each session asks for a long story with `max_tokens` 64 (the tokens counted
are those the usage reports; a story ends later than that).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SETTINGS = {  # name: TrainConfig fields
    "fp32 full": {},
    "bf16 full": {"bf16": True},
    "fp32 full, act. ckpt": {"gradient_checkpointing": True},
    "fp32 LoRA": {"lora": True},
    "bf16 LoRA": {"lora": True, "bf16": True},
    "fp32 LoRA, act. ckpt": {"lora": True, "gradient_checkpointing": True},
}


def train_one(model: str, samples: str, steps: int, fields: dict) -> dict:
    """Runs in a child process: the steps of one setting; its peak RSS is the setting's."""
    import torch
    from trainer_fixtures import make_trainer

    from harnessrl.trainer.grpo import HarnessTrainer

    torch.manual_seed(0)
    tr = make_trainer(HarnessTrainer, Path(model), Path(samples), steps=steps + 1, batch_size=8, lr=1e-6,
                      trainer_kwargs=dict(trl_args=dict(disable_tqdm=True, logging_steps=1)), **fields)
    times: list[float] = []

    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    tr.add_callback(Clock())
    tr.train()
    tokens = sum(len(s.input_ids) for s in tr.data.samples)
    per_step = sorted(times[1:]) if len(times) > 1 else times  # the first step warms up
    step = per_step[len(per_step) // 2]
    return {"step_s": step, "tokens": tokens, "tokens_per_s": tokens / step,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def samples_for(model: str, out: Path, rows: int, tools: int) -> Path:
    """`rows` two-call rollouts in groups of 4, their prompts rendered with the assistant family's
    first `tools` tools (2: about 300 tokens a row, the size of a small tool task's sample)."""
    from transformers import AutoTokenizer
    from trainer_fixtures import make_rows, write_samples

    from harnessrl.harness_examples.assistant.tasks import TOOLS

    tok = AutoTokenizer.from_pretrained(model)
    return write_samples(out, make_rows(tok, n_tasks=max(1, rows // 4), k=4, tools=TOOLS[:tools]))


def generation(url: str, model: str, sessions: int, rounds: int = 2) -> float:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="x")
    ask = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]

    def one(_: int) -> int:
        r = client.chat.completions.create(model=model, messages=ask, max_tokens=64, temperature=1.0)
        return r.usage.completion_tokens

    one(0)  # warm-up
    t0 = time.perf_counter()
    with ThreadPoolExecutor(sessions) as pool:
        done = sum(pool.map(one, range(sessions * rounds)))
    return done / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tools", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated settings (default: all)")
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--vllm", action="store_true", help="also vLLM's CPU build (about 2 minutes to start)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        spec = json.loads(a.child)
        print(json.dumps(train_one(a.model, spec["samples"], a.steps, spec["fields"])))
        return
    with tempfile.TemporaryDirectory() as tmp:
        if not a.no_train:
            samples = samples_for(a.model, Path(tmp) / "samples", a.rows, a.tools)
            print(f"training: {a.rows} rows with {a.tools} tools in the prompt, median of {a.steps} steps after a warm-up",
                  flush=True)
            print("| setting | step s | tokens/s | peak RSS GiB |\n|---|---|---|---|", flush=True)
            for name, fields in SETTINGS.items():
                if a.only and name not in a.only.split(","):
                    continue
                child = subprocess.run([sys.executable, __file__, "--model", a.model, "--steps", str(a.steps),
                                        "--child", json.dumps({"samples": str(samples), "fields": fields})],
                                       capture_output=True, text=True)
                if child.returncode:
                    print(f"| {name} | failed: {child.stderr.strip().splitlines()[-1]} | | |", flush=True)
                    continue
                r = json.loads(child.stdout.strip().splitlines()[-1])
                print(f"| {name} | {r['step_s']:.1f} | {r['tokens_per_s']:.0f} | {r['peak_rss_gib']:.2f} |", flush=True)
        from harnessrl.proxy.server import ProxyConfig, run_proxy

        print("\ngeneration through the proxy (64 tokens a session)\n| server | 1 session tok/s | 8 sessions tok/s |\n"
              "|---|---|---|", flush=True)
        with run_proxy(ProxyConfig(db=str(Path(tmp) / "runs.db"), backend="local", model=a.model, port=0)) as proxy:
            print(f"| local backend | {generation(proxy.url, 'm', 1):.1f} | {generation(proxy.url, 'm', 8):.1f} |",
                  flush=True)
        if a.vllm:
            vllm_generation(a.model, Path(tmp))


def vllm_generation(model: str, tmp: Path) -> None:
    import os
    import socket

    from harnessrl.proxy.server import ProxyConfig, run_proxy

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = str(Path(sys.executable).with_name("harnessrl"))
    log = open(tmp / "vllm.log", "w")
    server = subprocess.Popen([exe, "vllm", model, "--port", str(port), "--served-model-name", "m"],
                              stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        import httpx

        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None:
                raise SystemExit(f"vLLM exited: see {tmp / 'vllm.log'}")
            time.sleep(1)
        with run_proxy(ProxyConfig(db=str(tmp / "vllm.db"), upstream=f"http://127.0.0.1:{port}", port=0,
                                   tokenizer=model, served_model_name="m")) as proxy:
            print(f"| vLLM CPU | {generation(proxy.url, 'm', 1):.1f} | {generation(proxy.url, 'm', 8):.1f} |", flush=True)
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()
