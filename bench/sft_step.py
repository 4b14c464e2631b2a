"""The warm start's step (trainer/sft.py) against its code before packing, on the same batches:
tokens computed, wall time of a forward and backward, peak RSS. docs/benchmarks.md › Shared prefixes.

    python bench/sft_step.py --model DIR [--family assistant|toolbox] [--batch-size 8] [--repeats 3]

`assistant` (the default): the assistant family's training tasks (nine tool schemas and the worked
call in every prompt), `toolbox`: the demo's family. Three ways, alternated after a warm-up of each:
`padded` (the code before: right-padded batch, full logits), `packed` (one row, the output layer at
targets only) and `packed, shared` (each shared prefix once: today's default). One torch thread
unless --threads."""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from trainer_fixtures import padded_sft_loss  # noqa: E402


def family_rows(family: str, tmp: Path):
    """The family's training tasks with their expert calls, as the warm start reads them."""
    from harnessrl.harness_examples.assistant import tasks as assistant
    from harnessrl.harness_examples.toolbox import tasks as toolbox
    from harnessrl.trainer.sft import read_sft_tasks

    tasks = {"assistant": assistant, "toolbox": toolbox}[family]
    return read_sft_tasks(tasks.write(tasks.generate(0)[0], tmp / "tasks.jsonl"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--family", choices=("assistant", "toolbox"), default="assistant")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harnessrl.trainer.packing import pack, use_packed_attention
    from harnessrl.trainer.prefix_tree import MIN_SHARED
    from harnessrl.trainer.sft import batch_loss, weighted_sequence

    tok = AutoTokenizer.from_pretrained(a.model)
    with tempfile.TemporaryDirectory() as tmp:
        seqs = [weighted_sequence(tok, p, e, t, 1.0) for p, e, t in family_rows(a.family, Path(tmp))]
    model = AutoModelForCausalLM.from_pretrained(a.model)
    use_packed_attention(model)  # unpacked (padded) calls keep SDPA's behaviour
    rng = random.Random(0)
    batches = [[seqs[rng.randrange(len(seqs))] for _ in range(a.batch_size)] for _ in range(a.repeats + 1)]
    ways = {"padded": lambda b: padded_sft_loss(model, b, tok.pad_token_id),
            "packed": lambda b: batch_loss(model, b, shared_prefix=False),
            "packed, shared": lambda b: batch_loss(model, b, shared_prefix=True)}
    times: dict[str, list[float]] = {w: [] for w in ways}
    losses: dict[str, list[float]] = {w: [] for w in ways}
    for i, batch in enumerate(batches):
        for way, loss_of in ways.items():
            model.zero_grad()
            t0 = time.perf_counter()
            loss = loss_of(batch)
            loss.backward()
            if i:  # the first batch warms up
                times[way].append(time.perf_counter() - t0)
                losses[way].append(loss.item())
    tokens = {"padded": sum(a.batch_size * max(len(ids) for ids, _ in b) for b in batches[1:]) / a.repeats,
              "packed": sum(sum(len(ids) for ids, _ in b) for b in batches[1:]) / a.repeats,
              "packed, shared": sum(pack([torch.tensor(ids) for ids, _ in b], [1] * len(b), 1, min_shared=MIN_SHARED).tokens
                                    for b in batches[1:]) / a.repeats}
    base = statistics.median(times["padded"])
    print(f"{a.family}, batch {a.batch_size}, {a.model}: median of {a.repeats} steps (forward + backward), "
          f"{a.threads} thread(s); peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    print("| way | tokens computed | step s | × padded | loss (mean) |\n|---|---|---|---|---|")
    for way in ways:
        t = statistics.median(times[way])
        print(f"| {way} | {tokens[way]:.0f} | {t:.2f} | {t / base:.2f} | {statistics.mean(losses[way]):.5f} |")


if __name__ == "__main__":
    main()
