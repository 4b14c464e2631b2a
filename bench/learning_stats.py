"""The statistics of bench/learning.py's and bench/fair.py's reports: 95% intervals of held-out
success (Wilson, over the pooled seed × task outcomes; and t, over per-seed differences), paired
t-tests with Holm's correction over the comparisons a report makes, and the verdicts drawn from
them — apart only when an interval (or the adjusted p) says so."""

from __future__ import annotations

import math


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% interval of a proportion p observed over n Bernoulli outcomes."""
    if n == 0:
        return (math.nan, math.nan)
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def pooled(values: list[float], n_each: int) -> tuple[float, float, float]:
    """Mean of per-seed rates over n_each tasks each, with the Wilson interval of the pooled outcomes."""
    mean = sum(values) / len(values)
    lo, hi = wilson(mean, n_each * len(values))
    return mean, lo, hi


def compare(a: tuple[float, float, float], b: tuple[float, float, float]) -> str:
    """Whether a is "above" or "below" b, given (mean, lo, hi) with 95% intervals: only when the
    intervals do not overlap, else "not separated" — with a few seeds the means alone would
    read noise as a difference."""
    if a[1] > b[2]:
        return "above"
    if a[2] < b[1]:
        return "below"
    return "not separated"


def verdicts(summary: dict[str, dict[str, tuple[float, float, float]]]) -> list[str]:
    """Held-out success after RL: each algorithm against its warm start, then each pair of algorithms."""
    lines = []
    for algo, c in summary.items():
        v = compare(c["after"], c["before"])
        lines.append(f"{algo}: " + ("not separated from" if v == "not separated" else v) + " the warm start")
    algos = list(summary)
    for i, x in enumerate(algos):
        for y in algos[i + 1:]:
            v = compare(summary[x]["after"], summary[y]["after"])
            lines.append(f"{x} vs {y}: " + ("not separated" if v == "not separated" else f"{x} {v} {y}"))
    return lines


def paired(diffs: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval of per-seed differences (after − before, or x − y on the same warm
    starts): the spread between seeds, which the pooled intervals do not hold."""
    from scipy.stats import t

    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return mean, math.nan, math.nan
    half = t.ppf(0.975, n - 1) * math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n)
    return mean, mean - half, mean + half


def seed_verdicts(runs: dict[str, list[dict]]) -> list[str]:
    """`verdicts` again, paired by seed, each with the p-value of its t-test Holm-adjusted over all
    the comparisons listed (each algorithm against its warm start, every pair): apart only when
    the adjusted p is below 0.05 — nine comparisons read at 95 % each would find a "difference"
    in one run of three by chance."""
    by_seed = {algo: {r["seed"]: r for r in rs} for algo, rs in runs.items()}
    rows = [(f"{algo} − warm start", [r["after"] - r["before"] for r in rs]) for algo, rs in runs.items()]
    algos = list(runs)
    for i, x in enumerate(algos):
        for y in algos[i + 1:]:
            seeds = sorted(set(by_seed[x]) & set(by_seed[y]))
            rows.append((f"{x} − {y}", [by_seed[x][s]["after"] - by_seed[y][s]["after"] for s in seeds]))
    tests = [paired_test(diffs) for _, diffs in rows]
    adjusted = holm([t[3] if t[3] == t[3] else 1.0 for t in tests])  # nan (one seed): nothing to claim
    lines = []
    for (label, diffs), (m, lo, hi, _), adj in zip(rows, tests, adjusted):
        v = ("above" if m > 0 else "below") if adj < 0.05 else "not separated"
        # the signs as well: an interval that spans 0 because one seed went the other way reads
        # differently from one that spans it because the seeds split
        ahead, behind = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
        lines.append(f"{label}: {m:+.3f} [{lo:+.2f}, {hi:+.2f}] per seed, Holm p {adj:.3f} of {len(rows)}, {v} "
                     f"(higher on {ahead}, lower on {behind} of {len(diffs)} seeds)")
    return lines


def paired_test(diffs: list[float]) -> tuple[float, float, float, float]:
    """`paired` with the two-sided p-value of the t-test that the mean per-seed difference is 0
    (1.0 when every difference is 0; 0.0 when they are all equal and not 0: no spread to doubt)."""
    from scipy.stats import t

    mean, lo, hi = paired(diffs)
    n = len(diffs)
    if n < 2:
        return mean, lo, hi, math.nan
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    if sd < 1e-12:  # equal differences (up to rounding): no spread to doubt them by
        return mean, lo, hi, 1.0 if abs(mean) < 1e-12 else 0.0
    return mean, lo, hi, float(2 * t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment of m p-values (family-wise error over the comparisons reported):
    the i-th smallest becomes max over j ≤ i of min(1, (m − j + 1)·p_(j)), in the input's order."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted
