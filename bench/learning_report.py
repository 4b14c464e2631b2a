"""bench/learning.py's report: the table, the verdicts (pooled and paired by seed), the per-seed
table, the two skills apart and the plot, all read from --out/results.json (its statistics in
learning_stats.py)."""

from __future__ import annotations

import json
from pathlib import Path

from learning_stats import compare, pooled, seed_verdicts, verdicts
from rich.console import Console
from rich.table import Table

PARTS = {"right_tool": "right tool (action)", "right_item": "right item (args)"}  # toolbox harness metrics


def report(out: Path, console: Console) -> None:
    """Table, verdicts and plot from --out/results.json (what a training run wrote)."""
    results = json.loads((out / "results.json").read_text())
    a, runs, n_eval = results["args"], results["runs"], results["n_eval"]
    split = a.get("eval_on", "held-out")  # `--eval-on validation`: the tuning split, not the held-out tasks
    seeds = sorted({r["seed"] for rs in runs.values() for r in rs})
    group = a.get("group_size", a.get("group"))  # results.json of runs before the flag was --group-size
    table = Table(title=f"{results['harness']}: {split} success and tool-call validity (greedy, {n_eval} tasks × "
                        f"{len(seeds)} seeds; mean [95% interval]); {a['rounds']} rounds, group {group}, "
                        f"temperature {a['temperature']}, {a['steps']}×{a['batch_size']} samples/round, lr {a['lr']}, "
                        f"ratio to {a.get('ratio_to', 'step')}, negative weight {a.get('negative_weight', 1.0)}")
    for col in ("algo", "success before", "success after", "validity before", "validity after",
                f"{split} per round", "s per run"):
        table.add_column(col)
    summary = {}
    for algo, rs in runs.items():
        cells = {k: pooled([r[k] for r in rs], n_eval)
                 for k in ("before", "after", "validity_before", "validity_after")}
        summary[algo] = cells
        curve = [sum(r["curve"][i] for r in rs) / len(rs) for i in range(a["rounds"])]
        table.add_row(algo, *(f"{m:.3f} [{lo:.2f}, {hi:.2f}]" for m, lo, hi in cells.values()),
                      " ".join(f"{c:.2f}" for c in curve), f"{sum(r['seconds'] for r in rs) / len(rs):.0f}")
    console.print(table)
    console.print(f"{split} success after RL (different when the 95% intervals do not overlap):")
    for line in verdicts(summary):
        console.print(f"  {line}")
    console.print(_per_seed(runs, split))
    console.print(f"paired by seed (mean difference of {split} success, 95% t-interval over seeds; the verdict by the "
                  "t-test's p, Holm-adjusted over every comparison listed):")
    for line in seed_verdicts(runs):
        console.print(f"  {line}")
    if all("parts_before" in r for rs in runs.values() for r in rs):
        _parts(runs, n_eval, console)
    _plot(summary, runs, out / "learning.png", results["harness"])
    if "wall_s" in results:
        reused = results.get("reused") or []
        console.print(f"wall time of the training run: {results['wall_s'] / 60:.1f} min"
                      + (f" (seeds {', '.join(map(str, reused))} kept from an earlier run, not in it)" if reused else ""))
    console.print(f"results in {out}/results.json, plot {out}/learning.png")


def _per_seed(runs: dict[str, list[dict]], split: str) -> Table:
    """Held-out success of every run, one row per seed: the pairs the t-intervals are made of.
    The warm start is the same for every algorithm of a seed (and so is its greedy evaluation)."""
    by_seed = {algo: {r["seed"]: r for r in rs} for algo, rs in runs.items()}
    seeds = sorted({s for rs in by_seed.values() for s in rs})
    table = Table(title=f"per seed: {split} success, warm start → after RL")
    for col in ("seed", "warm start", *runs):
        table.add_column(col)
    for s in seeds:
        warm = next(rs[s]["before"] for rs in by_seed.values() if s in rs)
        table.add_row(str(s), f"{warm:.3f}", *(f"{rs[s]['after']:.3f}" if s in rs else "" for rs in by_seed.values()))
    return table


def _parts(runs: dict[str, list[dict]], n_eval: int, console: Console) -> None:
    """The two skills apart, held out: the first call's tool (action) and its item (args)."""
    table = Table(title="held-out skills apart (first attribute call; mean [95% interval])")
    for col in ("algo", *(f"{PARTS[k]} {w}" for k in PARTS for w in ("before", "after"))):
        table.add_column(col)
    lines = []
    for algo, rs in runs.items():
        row = []
        for k in PARTS:
            before = pooled([r["parts_before"][k] for r in rs], n_eval)
            after = pooled([r["parts_after"][k] for r in rs], n_eval)
            row += [f"{m:.3f} [{lo:.2f}, {hi:.2f}]" for m, lo, hi in (before, after)]
            v = compare(after, before)
            lines.append(f"{algo}: {PARTS[k]} " + ("not separated from" if v == "not separated" else v) + " the warm start")
        table.add_row(algo, *row)
    console.print(table)
    for line in lines:
        console.print(f"  {line}")


def _plot(summary: dict, runs: dict[str, list[dict]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
    # the pairs the seed-level verdicts are made of: one line per seed through its warm start and
    # each algorithm's result on it
    by_seed = {algo: {r["seed"]: r for r in rs} for algo, rs in runs.items()}
    for s in sorted({s for rs in by_seed.values() for s in rs}):
        warm = next(rs[s]["before"] for rs in by_seed.values() if s in rs)
        xs = [i for i, rs in enumerate(by_seed.values()) if s in rs]
        axes[2].plot([-1, *xs], [warm, *(rs[s]["after"] for rs in by_seed.values() if s in rs)], marker="o",
                     alpha=0.7, label=f"seed {s}")
    axes[2].set_xticks(range(-1, len(runs)), ["warm start", *runs])
    axes[2].set_ylim(0, 1.05)
    axes[2].set_title("held-out success per seed")
    axes[2].legend(fontsize=7, ncol=2)
    for ax, (name, keys) in zip(axes[:2], (("held-out success", ("before", "after")),
                                       ("tool-call validity", ("validity_before", "validity_after")))):
        for j, key in enumerate(keys):
            xs = [i + (j - 0.5) * 0.35 for i in range(len(summary))]
            ms = [summary[a][key][0] for a in summary]
            # interval ends as distances from the mean; max(0, ·): at a mean of 0 or 1 rounding can
            # put the end a hair inside the mean, and matplotlib refuses negative error bars
            err = [[max(0.0, m - summary[a][key][1]) for a, m in zip(summary, ms)],
                   [max(0.0, summary[a][key][2] - m) for a, m in zip(summary, ms)]]
            ax.bar(xs, ms, width=0.35, yerr=err, capsize=3, label="after RL" if j else "warm start")
        ax.set_xticks(range(len(summary)), list(summary))
        ax.set_ylim(0, 1.05)
        ax.set_title(name)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}: mean over seeds, 95% intervals")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
