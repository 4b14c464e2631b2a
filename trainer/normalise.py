"""Loss normalisation over an optimizer step (docs/methods.md, "Loss aggregation").

A step's batch is split into micro-batches (gradient accumulation) and across processes (data
parallel). Every aggregation mode is a weighted sum Σ w·ℓ over the trainable tokens of the whole
step, with the weights fixed before the split:

  token_mean    w = 1/N          N: trainable tokens of the step
  seq_mean      w = 1/(S·n_s)    S: samples with a trainable token; n_s: the sample's tokens
  rollout_mean  w = 1/(R·n_r)    R: rollouts with a trainable token; n_r: the rollout's tokens over
                                 all of its samples, wherever they fall (a rollout counts once)
  prompt_mean   w = 1/(P·n_p)    P: prompts (tasks) with a trainable token; n_p: the tokens of all the
                                 prompt's rows in the step (PACT's per-prompt loss L_i, averaged)

A micro-batch contributes W·Σ_{its tokens} w·ℓ (W processes): summed over micro-batches it is the
step's aggregate, and data-parallel gradient averaging (÷W) makes the gradient that of the aggregate."""

from __future__ import annotations

from collections import defaultdict

import torch


def row_weights(rows: list[tuple[str, float]], everyone: list[tuple[str, float]], mode: str) -> list[float]:
    """Weight w of each trainable token of each local row.

    rows: (key, trainable tokens) of the rows here, the key being the row's rollout (rollout_mean)
    or prompt (prompt_mean); everyone: the same for every row of the step on every process, these
    included. Rows without a trainable token get 0."""
    if mode == "token_mean":
        n = sum(t for _, t in everyone)
        return [1.0 / n if t > 0 else 0.0 for _, t in rows]
    if mode == "seq_mean":
        s = sum(1 for _, t in everyone if t > 0)
        return [1.0 / (s * t) if t > 0 else 0.0 for _, t in rows]
    if mode in ("rollout_mean", "prompt_mean"):
        per_key: dict[str, float] = defaultdict(float)
        for key, t in everyone:
            per_key[key] += t
        r = sum(1 for t in per_key.values() if t > 0)
        return [1.0 / (r * per_key[key]) if t > 0 else 0.0 for key, t in rows]
    raise ValueError(f"unknown loss aggregation {mode!r}")


def token_weights(mask: torch.Tensor, keys: list[str], mode: str, gather=None) -> torch.Tensor:
    """(B, T) weights w·mask for a (B, T) mask whose rows belong to rollouts or prompts `keys`. `gather` maps this
    process's list of (key, tokens) to the list of every process (identity for one process)."""
    rows = list(zip(keys, mask.sum(-1).tolist()))
    everyone = gather(rows) if gather is not None else rows
    w = torch.tensor(row_weights(rows, everyone, mode), dtype=mask.dtype, device=mask.device)
    return mask * w[:, None]


def weighted_sum(per_token: torch.Tensor, weights: torch.Tensor, processes: int = 1) -> torch.Tensor:
    """This micro-batch's share of the step's aggregate (times W: data parallelism averages)."""
    return (per_token * weights).sum() * processes
