"""bench/async_loop.py's report, from its results.json: per family a table of the modes (means over
seeds), the async/sync ratios paired by seed, and the issue's targets, as Markdown (printed, and
written beside results.json as report.md for docs/benchmarks.md)."""

from __future__ import annotations

import statistics
from pathlib import Path

from learning_stats import pooled

# issue 43's targets: async wall ≤ 0.5× sync's, ≤ 1.25× the run's no-idle bound, trainer idle ≤ 20 %
WALL_RATIO, BOUND_RATIO, TRAINER_IDLE = 0.5, 1.25, 0.20


def report(results: dict) -> str:
    lines = []
    for family, runs in results.items():
        if family != "args" and runs:
            lines += _family(family, runs)
    text = "\n".join(lines)
    print(text)
    Path(results["args"]["out"], "report.md").write_text(text + "\n")
    return text


def by_mode(runs: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for key, r in runs.items():
        out.setdefault(key.split("/")[0], []).append(r)
    return out


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _spread(xs: list[float], fmt: str) -> str:
    """Mean, with the range over seeds when there are several."""
    m = format(_mean(xs), fmt)
    return m if len(xs) < 2 else f"{m} ({format(min(xs), fmt)}–{format(max(xs), fmt)})"


def _family(family: str, runs: dict) -> list[str]:
    modes = by_mode(runs)
    seeds = sorted({r["seed"] for r in runs.values()})
    lines = [f"### {family}: {len(seeds)} seed(s) {', '.join(map(str, seeds))}", "",
             "| mode | wall s | trainer idle | inference idle | no-idle bound s | wall ÷ bound | staleness mean / max "
             "| dropped stale | steps | samples | held-out success [95 %] | loss mean / max | mismatch KL |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    held = {}
    for mode, rs in modes.items():
        held[mode] = pooled([r["held_out"] for r in rs], rs[0]["n_eval"])
        losses = [x for r in rs for x in r["losses"]]
        lines.append(
            f"| {mode} | {_spread([r['wall_s'] for r in rs], '.0f')} | {_spread([r['trainer_idle'] for r in rs], '.2f')} "
            f"| {_spread([r['inference_idle'] for r in rs], '.2f')} | {_mean([r['bound_s'] for r in rs]):.0f} "
            f"| {_spread([r['wall_s'] / r['bound_s'] for r in rs], '.2f')} "
            f"| {_mean([r['mean_staleness'] for r in rs]):.2f} / {max(r['max_staleness'] for r in rs)} "
            f"| {sum(r['dropped_stale'] for r in rs)} | {_mean([r['steps'] for r in rs]):.0f} "
            f"| {_mean([r['samples'] for r in rs]):.0f} "
            f"| {held[mode][0]:.3f} [{held[mode][1]:.2f}, {held[mode][2]:.2f}] "
            f"| {_mean(losses):.3g} / {max(losses, key=abs, default=float('nan')):.3g} "
            f"| {_mean([r['mismatch_kl'] for r in rs if r.get('mismatch_kl') is not None]):.2g} |")
    lines.append("")
    if "sync" in modes:
        sync = {r["seed"]: r for r in modes["sync"]}
        for mode in (m for m in modes if m != "sync"):
            lines += _targets(mode, modes[mode], sync, held)
    return lines + [""]


def _targets(mode: str, rs: list[dict], sync: dict[int, dict], held: dict) -> list[str]:
    """The issue's targets for one async mode, its wall ratio paired by seed with sync's."""
    ratios = [r["wall_s"] / sync[r["seed"]]["wall_s"] for r in rs if r["seed"] in sync]
    bound = [r["wall_s"] / r["bound_s"] for r in rs]
    idle = [r["trainer_idle"] for r in rs]
    lo = held["sync"][1]

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    return [f"{mode} against the targets:", "",
            f"- wall ÷ sync's (by seed): {_spread(ratios, '.2f')}, target ≤ {WALL_RATIO}: "
            f"{verdict(_mean(ratios) <= WALL_RATIO)}",
            f"- wall ÷ the run's no-idle bound: {_spread(bound, '.2f')}, target ≤ {BOUND_RATIO}: "
            f"{verdict(_mean(bound) <= BOUND_RATIO)}",
            f"- trainer idle: {_spread(idle, '.2f')}, target ≤ {TRAINER_IDLE:.2f}: {verdict(_mean(idle) <= TRAINER_IDLE)}",
            f"- held-out success {held[mode][0]:.3f} against sync's interval [{lo:.2f}, {held['sync'][2]:.2f}]: "
            f"{'not below' if held[mode][0] >= lo else 'below'}", ""]
