"""One optimizer step of each objective vs a plain TRL GRPOTrainer loss step on identical tensors.

    python bench/train_step.py [--model DIR] [--tasks 4] [--k 4] [--repeats 10] [--clock cpu|wall] [--no-shared-prefix]

Every trainer sees the same compiled batch (prepared once, outside the timing); a step is
loss + backward(s) + optimizer step. The baseline is `trl.GRPOTrainer._compute_loss` (loss_type
bnpo = token mean) on the same prompt/completion/mask/advantage tensors. Memory: peak allocated
CUDA memory on a GPU; on CPU, the bytes autograd saves for backward (activations), the part of a
step's memory that the objectives change. Time: on CPU the process's CPU time by default (one
torch thread: the step's own work, which other processes on a shared machine barely move), wall
time on a GPU. Ratios are against the baseline measured in this run;
"time × per token" divides by the tokens forwarded (PACT forwards its privileged prompts and SFT
sequences too). `capo` is the default routing (heads and MLP units, shared remainder); `capo
mlp/leak` the earlier rule (three separate gradients). The round-start scoring of `ratio_to: round`
happens once per round, outside the steps, and is printed apart."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from trainer_fixtures import tiny_samples  # noqa: E402  (the tests' sample writer: real tokenizer ids)


@contextmanager
def saved_bytes(counter: list[int]):
    def pack(t):
        counter[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


class Runner:
    """One trainer stepping on its fixed batch."""

    def __init__(self, trainer, batch, steps: int, clock):
        self.trainer, self.times, self.mem, self.clock = trainer, [], 0.0, clock
        trainer._prepare_inputs = lambda _rows: batch  # the batch is built once, outside the timing
        trainer.create_optimizer_and_scheduler(num_training_steps=steps)
        trainer.current_gradient_accumulation_steps = 1
        trainer.model.train()

    def step(self, record: bool) -> None:
        cuda = torch.cuda.is_available()
        counter = [0]
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = self.clock()
        with saved_bytes(counter):
            self.trainer.training_step(self.trainer.model, None, None)
        self.trainer.optimizer.step()
        self.trainer.optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        if record:
            self.times.append(self.clock() - t0)
            self.mem = max(self.mem, torch.cuda.max_memory_allocated() if cuda else counter[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model directory (default: build the tiny test model)")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--q", type=float, default=0.4, help="PACT anchoring probability")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier on a shared machine)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default=None,
                    help="cpu: this process's CPU time (the default on CPU: with one thread it is the step's work, and other "
                         "processes on the machine barely move it); wall: elapsed time (the default on a GPU)")
    ap.add_argument("--no-shared-prefix", action="store_true",
                    help="every sample's whole prompt computed (the trainer before shared prefixes; the TRL baseline's way)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    clock = time.process_time if (a.clock or ("wall" if torch.cuda.is_available() else "cpu")) == "cpu" else time.perf_counter

    from datasets import Dataset as HFDataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from harnessrl.trainer.capo import CapoTrainer
    from harnessrl.trainer.capo_partition import build_partition, write_outputs
    from harnessrl.trainer.config import TrainConfig
    from harnessrl.trainer.data import load_samples
    from harnessrl.trainer.grpo import HarnessTrainer, compiled_reward, grpo_args
    from harnessrl.trainer.matpo import MatpoTrainer
    from harnessrl.trainer.pact import PactTrainer

    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    if a.model is None:
        from harnessrl.tiny_model import build_tiny_model

        a.model = str(build_tiny_model(tmp / "tiny"))  # minutes on a slow CPU: pass --model to reuse one
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = a.tasks * a.k
    samples = tiny_samples(tmp / "samples", Path(a.model), traces=True, n_tasks=a.tasks, k=a.k, rewards=[1.0, 0.0] * n)
    data = load_samples(samples)
    tok = AutoTokenizer.from_pretrained(a.model)

    def fresh_model():
        return AutoModelForCausalLM.from_pretrained(a.model).to(device)

    part, report = build_partition(fresh_model(), data.samples)
    write_outputs(part, report, tmp / "partition.pt")

    def cfg(**kw):
        return TrainConfig(samples=str(samples), model=a.model, out=str(tmp / "out"), steps=a.repeats + 2, batch_size=n,
                           lr=1e-6, report_to="none", shared_prefix=not a.no_shared_prefix, **kw).validate()

    base_cfg = cfg()
    grpo = HarnessTrainer(fresh_model(), base_cfg, data, tok)
    batch = grpo.fixed_batch()
    trl_batch = {k: batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")}
    trl_batch.update(tool_mask=batch["loss_mask"], num_items_in_batch=batch["loss_mask"].sum())
    plain = GRPOTrainer(model=fresh_model(), reward_funcs=[compiled_reward], processing_class=tok,
                        args=grpo_args(base_cfg, loss_type="bnpo"), train_dataset=HFDataset.from_dict({"prompt": ["x"] * n}))
    matpo = MatpoTrainer(fresh_model(), cfg(algo="matpo"), data, tok)
    capo = CapoTrainer(fresh_model(), cfg(algo="capo", partition=str(tmp / "partition.pt")), data, tok)
    leak = CapoTrainer(fresh_model(), cfg(algo="capo", partition=str(tmp / "partition.pt"), capo_units="mlp",
                                          capo_remainder="leak"), data, tok)
    pact = PactTrainer(fresh_model(), cfg(algo="pact", pact_q=a.q), data, tok)
    pact_batch = pact.fixed_batch()
    steps = a.repeats + 2
    runners = {
        "trl GRPOTrainer": Runner(plain, trl_batch, steps, clock), "grpo": Runner(grpo, batch, steps, clock),
        "matpo": Runner(matpo, matpo.fixed_batch(), steps, clock), "capo": Runner(capo, capo.fixed_batch(), steps, clock),
        "capo mlp/leak": Runner(leak, leak.fixed_batch(), steps, clock), "pact": Runner(pact, pact_batch, steps, clock),
    }
    # Round-robin, so that load from other processes falls on every objective alike; 2 warm-up rounds.
    for r in range(steps):
        for runner in runners.values():
            runner.step(record=r >= 2)
    results = {name: (statistics.median(x.times), x.mem) for name, x in runners.items()}
    batches = {"trl GRPOTrainer": trl_batch, "grpo": batch, "matpo": batch, "capo": batch, "capo mlp/leak": batch, "pact": pact_batch}
    # ratio_to: round scores logp_old once per round, outside the steps: a no-grad forward of each later step's batch
    scoring = []
    for _ in range(a.repeats):
        t = clock()
        with torch.no_grad():
            grpo.policy_logps(grpo.model, batch)
        scoring.append(clock() - t)

    from rich.console import Console
    from rich.table import Table

    t0, m0 = results["trl GRPOTrainer"]
    targets = {"grpo": 1.05, "matpo": None, "capo": 1.3, "pact": None}  # pact: ≤ 1.3 per trained token
    table = Table(title=f"train step on {device} ({'CPU' if clock is time.process_time else 'wall'} time), {n} samples, {int(batch['completion_mask'].sum())} completion tokens "
                        f"(pact: {int(pact_batch['gate'].eq(0).sum())} of {n} rows on the trace)")
    def tokens(b) -> int:  # tokens forwarded per step (PACT: privileged prompts and SFT sequences too)
        return int(b["prompt_mask"].sum() + b["completion_mask"].sum() + (b["sft_mask"].sum() if "sft_mask" in b else 0))

    for col in ("objective", "step ms", "time ×", "target ×", "memory", "memory ×", "tokens ×", "time × per token"):
        table.add_column(col, justify="right")
    unit = "MiB" if device == "cuda" else "MiB saved"
    for name, (t, m) in results.items():
        tgt = targets.get(name)
        per = tokens(batches[name]) / tokens(trl_batch)
        table.add_row(name, f"{t * 1e3:.1f}", f"{t / t0:.2f}", "" if tgt is None else f"≤ {tgt}", f"{m / 2**20:.2f} {unit}",
                      f"{m / m0:.2f}", f"{per:.2f}", f"{t / t0 / per:.2f}" + (" (≤ 1.3)" if name == "pact" else ""))
    console = Console(width=150)
    console.print(table)
    s = statistics.median(scoring)
    console.print(f"ratio_to round: logp_old scored once at a round's start, a no-grad forward of each later step's batch: "
                  f"{s * 1e3:.1f} ms per step ({s / t0:.2f}× the TRL step), paid once per round")


if __name__ == "__main__":
    main()
