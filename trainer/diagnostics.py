"""Logged diagnostics (entropy, KL, clip ratio, loss terms) as ratios of sums, so that they do not
depend on how a step is split into micro-batches and processes.

A micro-batch adds (Σ value·mask, Σ mask) for a token statistic; at each log the sums of every
micro-batch since the last log are added over processes and the ratio is logged. The mean of
per-micro-batch means it replaces weighs a micro-batch of 10 tokens like one of 1000: on one
batch the entropy logged 2.294 at grad_accum 1 and 2.774 at grad_accum 3."""

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

    def add(self, mode: str, name: str, num: torch.Tensor | float, den: torch.Tensor | float) -> None:
        acc = self.sums[(mode, name)]
        acc[0] += float(num)
        acc[1] += float(den)

    def clear(self) -> None:
        self.sums.clear()

    def flush(self, gather: Callable[[list], list] | None = None) -> list[tuple[str, str, float]]:
        """(mode, name, Σ num / Σ den) over this process's sums, and every process's through `gather`
        (a collective: every process calls it at every log); names with Σ den = 0 are left out."""
        mine = [(mode, name, num, den) for (mode, name), (num, den) in self.sums.items()]
        self.sums.clear()
        total: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        for mode, name, num, den in (gather(mine) if gather is not None else mine):
            total[(mode, name)][0] += num
            total[(mode, name)][1] += den
        return [(mode, name, num / den) for (mode, name), (num, den) in sorted(total.items()) if den != 0]
