"""Compiled samples in, padded tensors out, and the loss aggregation modes (docs/methods.md §6 common).

A sample's "prompt" is the root call's prompt (`prompt_len` tokens); everything after it is the
"completion" TRL scores. Observation tokens inside it keep attention but have loss mask 0, so the
attention mask and the loss mask are separate tensors (TRL's `completion_mask` / `tool_mask`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from harnessrl.errors import UserError

# the columns of SAMPLE_SCHEMA (harnessrl/samples.py) that training reads: only these are converted
# (per-token columns cost the most), and a compile output from before a column was added still trains
TRAINED_COLUMNS = ("sample_id", "rollout_id", "task_id", "group_id", "agent", "outcome_reward", "input_ids", "loss_mask",
                   "token_class", "advantage", "behaviour_logprob", "prompt_len")


@dataclass
class Sample:
    sample_id: str
    rollout_id: str
    task_id: str | None
    group_id: str | None
    agent: str | None
    outcome_reward: float
    input_ids: list[int]
    loss_mask: list[int]
    token_class: list[int]
    advantage: list[float]
    behaviour_logprob: list[float]  # nan where unknown
    prompt_len: int


@dataclass
class Task:
    task_id: str
    input: Any = None
    reference: Any = None
    expert_trace: dict | None = None


@dataclass
class Dataset:
    samples: list[Sample]
    tasks: dict[str, Task] = field(default_factory=dict)


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def load_samples(samples_dir: str | Path) -> Dataset:
    """Read `samples.parquet` (and `tasks.parquet` when present) written by `harnessrl compile`."""
    import pyarrow.parquet as pq

    d = Path(samples_dir)
    path = d / "samples.parquet" if d.is_dir() else d
    if not path.is_file():
        raise UserError(f"no samples found: {path} (run `harnessrl compile` first)")
    try:
        names = pq.read_schema(path).names
        missing = [n for n in TRAINED_COLUMNS if n not in names]
        if missing:
            raise UserError(f"{path} is not a compiled sample file (missing columns: {', '.join(missing)})")
        table = pq.read_table(path, columns=list(TRAINED_COLUMNS))
    except UserError:
        raise
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise UserError(f"cannot read {path}: {exc}") from None
    rows = table.to_pylist()
    samples = []
    for r in rows:
        n = len(r["input_ids"])
        if not (len(r["loss_mask"]) == len(r["token_class"]) == len(r["advantage"]) == len(r["behaviour_logprob"]) == n):
            raise UserError(f"sample {r['sample_id']}: per-token columns differ in length")
        if not 0 <= r["prompt_len"] <= n:
            raise UserError(f"sample {r['sample_id']}: prompt_len {r['prompt_len']} outside 0..{n}")
        samples.append(
            Sample(
                sample_id=r["sample_id"],
                rollout_id=r["rollout_id"] or r["sample_id"],
                task_id=r["task_id"],
                group_id=r["group_id"] or r["task_id"],
                agent=r["agent"],
                outcome_reward=float(r["outcome_reward"] or 0.0),
                input_ids=r["input_ids"],
                loss_mask=r["loss_mask"],
                token_class=r["token_class"],
                advantage=r["advantage"],
                behaviour_logprob=[math.nan if v is None else v for v in r["behaviour_logprob"]],
                prompt_len=r["prompt_len"],
            )
        )
    samples = [s for s in samples if any(s.loss_mask[s.prompt_len:])]
    if not samples:
        raise UserError(f"{path} holds no sample with a trainable token")
    tasks: dict[str, Task] = {}
    tpath = path.with_name("tasks.parquet")
    if tpath.is_file():
        for r in pq.read_table(tpath).to_pylist():
            tasks[r["task_id"]] = Task(r["task_id"], _json(r.get("input")), _json(r.get("reference")), _json(r.get("expert_trace")))
    return Dataset(samples, tasks)


def collate(samples: list[Sample], pad_id: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Left-pad prompts and right-pad completions, TRL's layout. Per-token columns cover the completion."""
    B = len(samples)
    P = max(s.prompt_len for s in samples)
    C = max(len(s.input_ids) - s.prompt_len for s in samples)
    prompt_ids = torch.full((B, P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    completion_ids = torch.full((B, C), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((B, C), dtype=torch.long)
    loss_mask = torch.zeros((B, C), dtype=torch.float32)
    token_class = torch.zeros((B, C), dtype=torch.long)
    advantages = torch.zeros((B, C), dtype=torch.float32)
    behaviour = torch.full((B, C), math.nan, dtype=torch.float32)
    rollouts: dict[str, int] = {}
    rollout_index = torch.zeros(B, dtype=torch.long)
    for i, s in enumerate(samples):
        p, ids = s.prompt_len, s.input_ids
        c = len(ids) - p
        if p:
            prompt_ids[i, P - p:] = torch.tensor(ids[:p])
            prompt_mask[i, P - p:] = 1
        if c:
            completion_ids[i, :c] = torch.tensor(ids[p:])
            completion_mask[i, :c] = 1
            loss_mask[i, :c] = torch.tensor(s.loss_mask[p:], dtype=torch.float32)
            token_class[i, :c] = torch.tensor(s.token_class[p:])
            advantages[i, :c] = torch.tensor(s.advantage[p:], dtype=torch.float32)
            behaviour[i, :c] = torch.tensor(s.behaviour_logprob[p:], dtype=torch.float32)
        rollout_index[i] = rollouts.setdefault(s.rollout_id, len(rollouts))
    out = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "loss_mask": loss_mask * completion_mask,
        "token_class": token_class,
        "advantages": advantages,
        "behaviour_logps": behaviour,
        "rollout_index": rollout_index,
    }
    return {k: v.to(device) for k, v in out.items()}


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, rollout_index: torch.Tensor | None = None) -> torch.Tensor:
    """Reduce a (B, T) per-token loss under a (B, T) 0/1 (or weighted) mask.

    token_mean: Σ l·m / Σ m over the batch; seq_mean: mean over samples with tokens of each sample's
    token mean; rollout_mean: mean over rollouts of the token mean over all of a rollout's samples."""
    if mode == "token_mean":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if mode == "seq_mean":
        tokens = mask.sum(-1)
        per_seq = (per_token * mask).sum(-1) / tokens.clamp(min=1.0)
        has = (tokens > 0).to(per_seq.dtype)
        return (per_seq * has).sum() / has.sum().clamp(min=1.0)
    if mode == "rollout_mean":
        if rollout_index is None:
            raise ValueError("rollout_mean needs rollout_index")
        n = int(rollout_index.max()) + 1 if rollout_index.numel() else 0
        sums = torch.zeros(n, dtype=per_token.dtype, device=per_token.device).index_add(0, rollout_index, (per_token * mask).sum(-1))
        counts = torch.zeros(n, dtype=per_token.dtype, device=per_token.device).index_add(0, rollout_index, mask.sum(-1).to(per_token.dtype))
        has = (counts > 0).to(per_token.dtype)
        return (sums / counts.clamp(min=1.0) * has).sum() / has.sum().clamp(min=1.0)
    raise ValueError(f"unknown loss aggregation {mode!r}")


def limit_length(samples: list[Sample], max_tokens: int, mode: str) -> tuple[list[Sample], int, int]:
    """Samples longer than `max_tokens`: cut to their first `max_tokens` tokens (mode "truncate": the
    session's start is the context of everything after it) or left out ("skip"). A sample with no
    trainable token left is left out too. Returns (samples, truncated, skipped)."""
    kept, truncated, skipped = [], 0, 0
    for s in samples:
        if len(s.input_ids) <= max_tokens:
            kept.append(s)
            continue
        cut = replace(s, input_ids=s.input_ids[:max_tokens], loss_mask=s.loss_mask[:max_tokens],
                      token_class=s.token_class[:max_tokens], advantage=s.advantage[:max_tokens],
                      behaviour_logprob=s.behaviour_logprob[:max_tokens], prompt_len=min(s.prompt_len, max_tokens))
        if mode == "truncate" and any(cut.loss_mask[cut.prompt_len:]):
            kept.append(cut)
            truncated += 1
        else:
            skipped += 1
    return kept, truncated, skipped
