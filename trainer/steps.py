"""Which samples make each optimizer step, and their split into micro-batches by a token budget.

Each step takes the next `per_step` samples of a seeded shuffle (an incomplete last chunk of an
epoch is dropped; the next epoch reshuffles); process r of W takes the r-th contiguous share. The
share is split into micro-batches of at most `budget` tokens each: longest sample first into the
least-loaded micro-batch (balanced, so the step's peak memory is as low as the count allows).

transformers' loop runs the same number of micro-batches in every step on every process (its
gradient synchronisation and DeepSpeed's accumulation boundary count them), so that number,
`micro`, is fixed for the run: the most any step of the run needs, and at least `min_micro`. A
step that needs fewer has its fullest micro-batches split until it has `micro`. The loss of a step
does not depend on the split (trainer/normalise.py)."""

from __future__ import annotations

import torch


def balanced(tokens: list[int], items: list[int], bins: int) -> list[list[int]]:
    """`items` into `bins` groups, longest first into the group with the fewest tokens."""
    groups: list[list[int]] = [[] for _ in range(bins)]
    load = [0] * bins
    for i in sorted(items, key=lambda i: -tokens[i]):
        b = min(range(bins), key=lambda b: (load[b], b))
        groups[b].append(i)
        load[b] += tokens[i]
    return [g for g in groups if g]


def fewest(tokens: list[int], items: list[int], budget: int, start: int = 1) -> list[list[int]]:
    """The balanced split into the fewest groups (from `start`) that keeps every group within `budget`."""
    for bins in range(max(start, 1), len(items) + 1):
        groups = balanced(tokens, items, bins)
        if max(sum(tokens[i] for i in g) for g in groups) <= budget:
            return groups
    return [[i] for i in items]  # every sample alone (each fits: checked when the plan is made)


class StepPlan:
    def __init__(self, tokens: list[int], per_step: int, processes: int, seed: int, steps: int, budget: int, min_micro: int = 1):
        self.tokens, self.per_step, self.processes, self.budget = tokens, per_step, processes, budget
        self.local = per_step // processes
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)
        self.orders: list[list[int]] = []
        self.per_epoch = len(tokens) // per_step
        need = max(len(self._fewest(s, r)) for s in range(steps) for r in range(processes))
        self.micro = min(max(need, min_micro), self.local)

    def samples(self, step: int, rank: int) -> list[int]:
        """Indices of process `rank`'s samples in optimizer step `step`."""
        epoch, k = divmod(step, self.per_epoch)
        while len(self.orders) <= epoch:
            self.orders.append(torch.randperm(len(self.tokens), generator=self.generator).tolist())
        chunk = self.orders[epoch][k * self.per_step:(k + 1) * self.per_step]
        return chunk[rank * self.local:(rank + 1) * self.local]

    def _fewest(self, step: int, rank: int) -> list[list[int]]:
        items = self.samples(step, rank)
        start = -(-sum(self.tokens[i] for i in items) // self.budget)  # no fewer than the tokens need
        return fewest(self.tokens, items, self.budget, start)

    def micro_batches(self, step: int, rank: int) -> list[list[int]]:
        """Exactly `self.micro` non-empty groups of sample indices, each within the budget."""
        groups = self._fewest(step, rank)
        while len(groups) < self.micro:
            big = max((g for g in groups if len(g) > 1), key=lambda g: sum(self.tokens[i] for i in g))
            groups.remove(big)
            groups += balanced(self.tokens, big, 2)
        return groups
