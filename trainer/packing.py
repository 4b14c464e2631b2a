"""Padding-free forward passes: a micro-batch's sequences laid end to end in one row (docs/methods.md, "Packing").

A padded micro-batch needs an explicit attention mask, and with a mask SDPA takes the kernel that
materialises the whole length × length score matrix per head (40k tokens: 25 GB). Packed, a
micro-batch is one row of all its sequences, position ids restarting at 0 for each, and attention
runs once per sequence with `is_causal` and no mask: the kernels that keep memory linear in length
(PyTorch's blocked flash kernel on CPU, flash / memory-efficient SDPA on GPU; `flash_attn`'s varlen
kernel in one call where that package is installed). Nothing is padded, so no token is computed twice.

The log-probs come from TRL's fused head (chunks of tokens × vocabulary, entropy included: the
vocabulary × length logits are never whole), read back into the (rows, completion) layout the
objectives use: `index[i, j]` is the packed position that predicts row i's scored token j."""

from __future__ import annotations

from dataclasses import dataclass

import torch

ATTENTION = "harnessrl_packed"


@dataclass
class Packed:
    """One packed row. `bounds`: sequence starts and the end (Python ints: slicing needs no device sync)."""

    input_ids: torch.Tensor  # (1, N)
    position_ids: torch.Tensor  # (1, N)
    labels: torch.Tensor  # (1, N): the token where it is scored, -100 elsewhere (the fused head shifts by one)
    bounds: tuple[int, ...]
    index: torch.Tensor  # (rows, K) positions in the head's output (length N − 1)
    valid: torch.Tensor  # (rows, K) bool

    @property
    def tokens(self) -> int:
        return self.bounds[-1]


def pack(seqs: list[torch.Tensor], score_from: list[int], width: int, device: torch.device | str = "cpu") -> Packed:
    """Pack 1-D token sequences (an empty one is left out; at least one is not); row i's tokens from `score_from[i]` on
    are scored, as columns 0.. of a (rows, width) output. A sequence's first token has no
    predecessor in it and is never scored."""
    starts, ids, pos, labels = [], [], [], []
    index = torch.zeros((len(seqs), width), dtype=torch.long)
    valid = torch.zeros((len(seqs), width), dtype=torch.bool)
    at = 0
    for i, (s, first) in enumerate(zip(seqs, score_from)):
        n = s.numel()
        if n == 0:
            continue
        starts.append(at)
        ids.append(s)
        pos.append(torch.arange(n))
        lab = torch.full((n,), -100, dtype=torch.long)
        first = max(first, 1)
        lab[first:] = s[first:]
        labels.append(lab)
        if first < n:
            t = torch.arange(first, min(n, score_from[i] + width))
            index[i, t - score_from[i]] = at + t - 1  # token t is predicted at position t − 1
            valid[i, t - score_from[i]] = True
        at += n
    return Packed(torch.cat(ids)[None].to(device), torch.cat(pos)[None].to(device), torch.cat(labels)[None].to(device),
                  tuple(starts) + (at,), index.to(device), valid.to(device))


def _attention(module, query, key, value, attention_mask, packed_bounds: tuple[int, ...] | None = None, **kwargs):
    """transformers' SDPA attention, run once per packed sequence (causal, no mask) when the call is packed."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is not None or packed_bounds is None or len(packed_bounds) <= 2 or query.size(0) != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # split, not slices: a slice's backward writes its gradient into a zeroed full-length tensor, once
    # per sequence and projection; split's backward is one concatenation
    sizes = [b - a for a, b in zip(packed_bounds[:-1], packed_bounds[1:])]
    parts = [sdpa_attention_forward(module, q, k, v, None, **kwargs)[0]
             for q, k, v in zip(*(x.split(sizes, dim=2) for x in (query, key, value)))]
    return torch.cat(parts, dim=1), None  # (1, N, heads, head_dim), as SDPA's


def _mask(*args, attention_mask=None, **kwargs):
    """No mask for a packed call (the sequences are separated by `_attention`); SDPA's otherwise."""
    from transformers.masking_utils import sdpa_mask

    return None if attention_mask is None else sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def use_packed_attention(model) -> None:
    """Switch the model to the packed attention: unpacked calls (generation, padded batches) keep SDPA's behaviour."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, _mask)
    model.set_attn_implementation(ATTENTION)


def packed_logps(trainer, model, packed: Packed, compute_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(rows, K) log-probs (and entropies) of the scored tokens; 0 where a row has none."""
    from harnessrl.trainer.trl_private import fused_logps

    logps, entropy = fused_logps(trainer, model, compute_entropy, input_ids=packed.input_ids, position_ids=packed.position_ids,
                                 labels=packed.labels, packed_bounds=packed.bounds)

    def rows(x: torch.Tensor) -> torch.Tensor:
        return torch.where(packed.valid, x[0][packed.index], torch.zeros((), dtype=x.dtype, device=x.device))

    return rows(logps), (rows(entropy) if entropy is not None else None)
