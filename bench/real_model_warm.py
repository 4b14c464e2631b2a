"""How far a warm start takes the real model on the assistant family: SFT on the expert's calls for
some training tasks (trainer/sft.py, shared prefixes on), and greedy held-out success along the way.
docs/benchmarks.md › The real model.

    python bench/real_model_warm.py --model SMOLLM2_DIR [--train-tasks 72] [--steps 60] [--eval-at 0,10,20,40,60]
        [--expert right|inconsistent]

The held-out tasks are the family's (combinations of a tool and a name never trained on); each is
answered greedily by `generate` on the prompt the harness sends (its messages and nine tools,
rendered by the model's chat template), up to 48 new tokens, and scored as the harness scores it:
its first tool call, the right tool (action) with the right name or place (args)."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def evaluate(model, tok, tasks) -> dict[str, float]:
    import torch

    from harnessrl.harness_examples.assistant.tasks import TOOLS
    from harnessrl.toolcalls import tool_calls_in

    model.eval()
    counts = {"called": 0, "action": 0, "args": 0, "success": 0}
    with torch.no_grad():
        for task in tasks:
            ids = tok.apply_chat_template(task.messages(), tools=TOOLS, add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True)
            out = model.generate(**ids, max_new_tokens=48, do_sample=False, pad_token_id=tok.eos_token_id)
            calls = tool_calls_in(tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=False))
            action, args = task.right(calls[0].name, calls[0].arguments) if calls else (False, False)
            for key, hit in (("called", bool(calls)), ("action", action), ("args", args), ("success", action and args)):
                counts[key] += hit
    model.train()
    return {k: v / len(tasks) for k, v in counts.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--train-tasks", type=int, default=72, help="training tasks whose expert calls are fine-tuned on (of 72)")
    ap.add_argument("--eval-tasks", type=int, default=36, help="held-out tasks evaluated (of 36)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--eval-at", default="0,10,20,40,60", help="steps after which to evaluate (0: the model as given)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--expert", choices=("right", "inconsistent"), default="right",
                    help="right: the task's call; inconsistent: 5 lines a task, 2 of them the asked tool and 3 "
                         "a confused one (assistant.tasks.inconsistent_expert: what the real-model demo would start from)")
    ap.add_argument("--out", type=Path, default=None, help="where the warm model goes (default: a temporary folder)")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harnessrl.harness_examples.assistant import tasks as assistant
    from harnessrl.trainer.sft import SftConfig, sft

    train, held = assistant.generate(a.seed)
    held = held[:a.eval_tasks]
    tok = AutoTokenizer.from_pretrained(a.model)
    at = {int(s) for s in a.eval_at.split(",")}
    rows: list[dict] = []
    t0 = time.perf_counter()

    def report(step: int, model) -> None:
        if step in at:
            t = time.perf_counter()
            r = {"step": step, **evaluate(model, tok, held), "eval_s": round(time.perf_counter() - t, 1),
                 "wall_s": round(t - t0, 1)}
            rows.append(r)
            print(json.dumps(r), flush=True)

    if 0 in at:
        report(0, AutoModelForCausalLM.from_pretrained(a.model))
    with tempfile.TemporaryDirectory() as tmp:
        tasks_file = Path(tmp) / "train.jsonl"
        if a.expert == "right":
            assistant.write(train[:a.train_tasks], tasks_file)
        else:
            tasks_file.write_text("".join(json.dumps(r) + "\n" for r in assistant.inconsistent_expert(train[:a.train_tasks])))
        sft(SftConfig(tasks=str(tasks_file), model=a.model, out=str(a.out or Path(tmp) / "warm"), steps=a.steps,
                      batch_size=a.batch_size, lr=a.lr, seed=a.seed), after_step=report)
    print(f"\nheld-out ({len(held)} tasks, greedy), SFT on {a.train_tasks} training tasks' expert calls ({a.expert}), batch {a.batch_size}, "
          f"lr {a.lr}\n| SFT steps | called | action | args | success | wall s |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['step']} | {r['called']:.3f} | {r['action']:.3f} | {r['args']:.3f} | {r['success']:.3f} | {r['wall_s']:.0f} |")


if __name__ == "__main__":
    main()
