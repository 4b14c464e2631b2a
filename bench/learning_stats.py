"""The statistics of bench/learning.py's and bench/fair.py's reports: 95% intervals of held-out
success (Wilson, over the pooled seed × task outcomes; and t, over per-seed differences), paired
t-tests and exact sign-flip tests (two- or one-sided) with Holm's correction over the comparisons a
report makes, and the verdicts drawn from them — apart only when an interval (or the adjusted p) says so."""

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


def paired_test(diffs: list[float], alternative: str = "two-sided") -> tuple[float, float, float, float]:
    """`paired` with the p-value of the t-test that the mean per-seed difference is 0: two-sided, or
    one-sided (`greater`: the claim is mean > 0; `less`: mean < 0) for a directional claim stated
    before the runs. Every difference 0: p = 1. Every difference equal and not 0, the t statistic is
    infinite and the t-test's p would be 0, which no test on n pairs can give: the exact sign-flip p
    of that case instead (2/2^n two-sided, 1/2^n one-sided in the direction of the differences)."""
    from scipy.stats import t

    _check_alternative(alternative)
    mean, lo, hi = paired(diffs)
    n = len(diffs)
    if n < 2:
        return mean, lo, hi, math.nan
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    if sd < 1e-12:  # equal differences (up to rounding): no spread for the t-test to use
        return mean, lo, hi, 1.0 if abs(mean) < 1e-12 else sign_flip_test(diffs, alternative)
    stat = mean / (sd / math.sqrt(n))
    if alternative == "greater":
        return mean, lo, hi, float(t.sf(stat, n - 1))
    if alternative == "less":
        return mean, lo, hi, float(t.cdf(stat, n - 1))
    return mean, lo, hi, float(2 * t.sf(abs(stat), n - 1))


ALTERNATIVES = ("two-sided", "greater", "less")
MAX_EXACT = 20  # 2^20 sign patterns: exact and still well under a second


def _check_alternative(alternative: str) -> None:
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative {alternative!r}: one of {', '.join(ALTERNATIVES)}")


def sign_flip_test(diffs: list[float], alternative: str = "two-sided") -> float:
    """Exact paired permutation (sign-flip) test of "the differences are symmetric about 0": under
    that null each difference's sign is a fair coin, so the p-value is the share of the 2^n sign
    patterns whose sum is at least as extreme as the observed sum (`two-sided`: |sum| ≥ |observed|;
    `greater`: sum ≥ observed; `less`: sum ≤ observed). No normality assumed, so it is the test for
    quantised per-seed rates. Its smallest p is 2/2^n two-sided (1/2^n one-sided): 6 pairs cannot go
    below 0.031. A difference of 0 flips to itself and counts in n, as in the enumeration.
    Exact up to MAX_EXACT pairs; above, refused rather than approximated silently."""
    import numpy as np

    _check_alternative(alternative)
    n = len(diffs)
    if n == 0:
        return math.nan
    if n > MAX_EXACT:
        raise ValueError(f"sign_flip_test: {n} pairs, exact enumeration only up to {MAX_EXACT}")
    d = np.asarray(diffs, dtype=float)
    signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)  # every ± pattern, one a row
    sums = signs @ d
    observed = float(d.sum())
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))  # ties in float sums count as ties
    if alternative == "greater":
        hits = sums >= observed - tol
    elif alternative == "less":
        hits = sums <= observed + tol
    else:
        hits = np.abs(sums) >= abs(observed) - tol
    return float(hits.sum()) / 2 ** n


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
