"""Logged diagnostics (entropy, KL, clip ratio, loss terms) as ratios of sums, so that they do not
depend on how a step is split into micro-batches and processes.

A micro-batch adds (Σ value·mask, Σ mask) for a token statistic; at each log the sums of every
micro-batch since the last log are added over processes and the ratio is logged. The mean of
per-micro-batch means it replaces weighs a micro-batch of 10 tokens like one of 1000: on one
batch the entropy logged 2.294 at grad_accum 1 and 2.774 at grad_accum 3. A maximum (`add_max`) is
the largest value over the micro-batches and processes, split-independent as well."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

import torch


def masked_sums(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ value·mask, Σ mask): a token mean's numerator and denominator."""
    return (values * mask).sum(), mask.sum()


class Diagnostics:
    def __init__(self) -> None:
        self.sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.maxima: dict[tuple[str, str], float] = {}

    def add(self, mode: str, name: str, num: torch.Tensor | float, den: torch.Tensor | float) -> None:
        acc = self.sums[(mode, name)]
        acc[0] += float(num)
        acc[1] += float(den)

    def add_max(self, mode: str, name: str, value: torch.Tensor | float) -> None:
        key = (mode, name)
        self.maxima[key] = max(self.maxima.get(key, float("-inf")), float(value))

    def clear(self) -> None:
        self.sums.clear()
        self.maxima.clear()

    def flush(self, gather: Callable[[list], list] | None = None) -> list[tuple[str, str, float]]:
        """(mode, name, Σ num / Σ den) over this process's sums, and every process's through `gather`
        (a collective: every process calls it at every log); names with Σ den = 0 are left out.
        Maxima travel as (mode, name, value, None) and come back as the largest value."""
        mine = [(mode, name, num, den) for (mode, name), (num, den) in self.sums.items()]
        mine += [(mode, name, value, None) for (mode, name), value in self.maxima.items()]
        self.clear()
        total: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        maxima: dict[tuple[str, str], float] = {}
        for mode, name, num, den in (gather(mine) if gather is not None else mine):
            if den is None:
                maxima[(mode, name)] = max(maxima.get((mode, name), num), num)
                continue
            total[(mode, name)][0] += num
            total[(mode, name)][1] += den
        out = [(mode, name, num / den) for (mode, name), (num, den) in total.items() if den != 0]
        return sorted(out + [(mode, name, value) for (mode, name), value in maxima.items()])
