"""BFCL single-turn accuracy of a model, per category, the way BFCL's leaderboard scores it: AST
checker, greedy, accuracy = correct / total of each category; here on the held-out ids of
harness_examples/bfcl_single (the ids `loop --harness bfcl_single` never trains on).

    python bench/bfcl_accuracy.py --model DIR                        # all 436 held-out entries, local backend
    python bench/bfcl_accuracy.py --model DIR --per-category 20      # the first 20 of each category
    python bench/bfcl_accuracy.py --proxy URL --per-category 20      # a running proxy (its served model)
    python bench/bfcl_accuracy.py --per-category 2                   # the tiny model (built here): a smoke run

Each entry is one rollout of the bfcl_single harness at temperature 0 (one model call with the
entry's functions as tools, BFCL's OpenAI conversion), recorded by the proxy under run
`--run`, its outcome BFCL's own AST checker. Printed: correct / total and accuracy per category with
a 95% Wilson interval, and all categories pooled; `--out FILE` writes the same as JSON (with each
entry's verdict) for comparing a model zero-shot against its RL checkpoints. Without `--proxy`
the proxy's embedded local backend serves `--model`, recording to a temporary SQLite file.
(Not bench/bfcl_eval.py: run as a script, its folder comes first on sys.path, and that name
would shadow the `bfcl_eval` package.) BFCL's own summary columns (its "Non-Live" / "Live" averages) are not computed: they also need
categories outside these six (irrelevance, Java, JavaScript).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from rich.table import Table

from harnessrl.console import Console
from harnessrl.harness_examples.bfcl_single import data
from harnessrl.harness_examples.bfcl_single.harness import BfclSingleConfig, run_rollout
from harnessrl.harness_examples.chat import RolloutResult
from harnessrl.harness_examples.runner import run_many

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_stats import wilson  # noqa: E402


def evaluate(url: str, tasks: list[data.BfclSingleTask], *, max_tokens: int, concurrency: int, run: str,
             model: str | None = None) -> dict:
    """Greedy rollouts of `tasks` through the proxy at `url`; per category correct / total."""
    cfg = BfclSingleConfig(model=model, max_tokens=max_tokens, temperature=0.0)

    def one(task: data.BfclSingleTask) -> RolloutResult:
        # a call that fails on our side (a timeout of a loaded server) is no answer of the model's:
        # kept as an error, out of the accuracy, and the other entries go on
        try:
            return run_rollout(url, task, cfg, run=run)
        except Exception as exc:  # noqa: BLE001 - any failure of one entry's call
            return RolloutResult("", task.id, float("nan"), "", {}, f"{type(exc).__name__}: {exc}")

    started = time.perf_counter()
    results = run_many(one, tasks, 1, concurrency, label="bfcl")
    by_id = {t.id: t for t in tasks}
    per: dict[str, dict] = {}
    entries = []
    for r in results:
        category = by_id[r.task_id].category
        row = per.setdefault(category, {"correct": 0, "total": 0, "errors": 0})
        if r.outcome != r.outcome:  # nan: the call failed
            row["errors"] += 1
        else:
            row["total"] += 1
            row["correct"] += int(r.outcome == 1.0)
        entries.append({"id": r.task_id, "category": category, "valid": r.outcome == 1.0, "verdict": r.answer,
                        "error": r.error})
    return {"categories": {c: per[c] for c in data.CATEGORIES if c in per}, "entries": entries,
            "seconds": round(time.perf_counter() - started, 1)}


def table(report: dict, title: str) -> Table:
    t = Table(title=title)
    for col in ("category", "correct", "total", "accuracy", "95% interval", "failed calls"):
        t.add_column(col, justify="left" if col == "category" else "right")
    rows = list(report["categories"].items())
    pooled = {k: sum(r[k] for _, r in rows) for k in ("correct", "total", "errors")}
    for name, r in rows + [("all (pooled)", pooled)]:
        p = r["correct"] / r["total"] if r["total"] else float("nan")
        lo, hi = wilson(p, r["total"])
        t.add_row(name, str(r["correct"]), str(r["total"]), f"{p:.3f}", f"{lo:.3f}–{hi:.3f}", str(r["errors"]))
    return t


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory served by the local backend "
                    "(default: the tiny model, built here; with --proxy: the model name to ask for)")
    ap.add_argument("--proxy", default=None, help="a running harnessrl proxy's URL instead of a local backend")
    ap.add_argument("--categories", default=",".join(data.CATEGORIES), help="comma-separated BFCL categories")
    ap.add_argument("--per-category", type=int, default=None, help="the first N held-out entries of each "
                    "category (default: all)")
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens per reply (parallel answers hold several calls)")
    ap.add_argument("--concurrency", type=int, default=4, help="rollouts in flight (the local backend answers one "
                    "at a time: more only queue, and a queued call can time out on a loaded machine)")
    ap.add_argument("--run", default="bfcl-eval", help="run tag of the recorded rollouts")
    ap.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    a = parse_args(argv)
    tasks = data.held_out([c.strip() for c in a.categories.split(",") if c.strip()], a.per_category)
    with tempfile.TemporaryDirectory(prefix="bench-bfcl-") as tmp:
        if a.proxy:
            report = evaluate(a.proxy, tasks, max_tokens=a.max_tokens, concurrency=a.concurrency, run=a.run,
                              model=a.model)
            served = a.model or a.proxy
        else:
            served = a.model
            if served is None:
                from harnessrl.tiny_model import build_tiny_model

                served = str(build_tiny_model(Path(tmp) / "tiny"))
            with run_proxy(ProxyConfig(db=str(Path(tmp) / "runs.db"), backend="local", model=served, port=0)) as p:
                report = evaluate(p.url, tasks, max_tokens=a.max_tokens, concurrency=a.concurrency, run=a.run)
    report = {"model": served, "split": "held-out", "greedy": True, "max_tokens": a.max_tokens, **report}
    Console().print(table(report, f"BFCL AST accuracy, held-out ids, greedy: {served} ({report['seconds']} s)"))
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
