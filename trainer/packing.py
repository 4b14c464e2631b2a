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

from harnessrl.trainer.prefix_tree import Segment, ancestry, prefix_tree

ATTENTION = "harnessrl_packed"


@dataclass
class Packed:
    """One packed row. `bounds`: segment starts and the end (Python ints: slicing needs no device sync);
    a segment is a whole sequence, or with shared prefixes a run of one (trainer/prefix_tree.py)."""

    input_ids: torch.Tensor  # (1, N)
    position_ids: torch.Tensor  # (1, N)
    labels: torch.Tensor  # (1, N): the token where it is scored, -100 elsewhere (the fused head shifts by one)
    bounds: tuple[int, ...]
    index: torch.Tensor  # (rows, K) positions in the head's output (length N − 1)
    valid: torch.Tensor  # (rows, K) bool
    # per segment, with shared prefixes: its ancestors' segment indices and the causal mask of its
    # tokens over theirs and its own (aligned at the bottom right); None: every segment a sequence
    tree: tuple[tuple[tuple[int, ...], torch.Tensor | None], ...] | None = None

    @property
    def tokens(self) -> int:
        return self.bounds[-1]


def pack(seqs: list[torch.Tensor], score_from: list[int], width: int, device: torch.device | str = "cpu",
         min_shared: int | None = None) -> Packed:
    """Pack 1-D token sequences (an empty one is left out; at least one is not); row i's tokens from `score_from[i]` on
    are scored, as columns 0.. of a (rows, width) output. A sequence's first token has no
    predecessor in it and is never scored. With `min_shared`, each prefix of at least that many
    tokens that several sequences share is packed once (trainer/prefix_tree.py)."""
    if min_shared is None:
        segments = [Segment(0, s.numel(), (i,), -1) for i, s in enumerate(seqs) if s.numel()]
    else:
        segments = prefix_tree(seqs, min_shared)
    starts, at = [], 0
    for seg in segments:
        starts.append(at)
        at += seg.end - seg.start
    ids = torch.cat([seqs[seg.rows[0]][seg.start:seg.end] for seg in segments])
    pos = torch.cat([torch.arange(seg.start, seg.end) for seg in segments])
    labels = torch.full((at,), -100, dtype=torch.long)
    index = torch.zeros((len(seqs), width), dtype=torch.long)
    valid = torch.zeros((len(seqs), width), dtype=torch.bool)
    path: list[list[int]] = [[] for _ in seqs]  # row i: its segments, root first
    for k, seg in enumerate(segments):
        for r in seg.rows:
            path[r].append(k)
    for i, s in enumerate(seqs):
        first = max(score_from[i], 1)
        if first >= s.numel():
            continue
        # where = the packed position of each of the row's depths
        where = torch.cat([torch.arange(starts[k], starts[k] + segments[k].end - segments[k].start) for k in path[i]])
        t = torch.arange(first, min(s.numel(), score_from[i] + width))
        index[i, t - score_from[i]] = where[t - 1]  # token t is predicted at depth t − 1
        valid[i, t - score_from[i]] = True
        # the label sits one packed position further: the same segment, or the first child that
        # follows its parent, whose first token every branch holds alike (prefix_tree)
        labels[where[t - 1] + 1] = s[t]
    tree = None
    if min_shared is not None:
        lineage = ancestry(segments)
        tree = tuple((up, _lower_right(segments, up, k, device) if up else None) for k, up in enumerate(lineage))
    return Packed(ids[None].to(device), pos[None].to(device), labels[None].to(device), tuple(starts) + (at,),
                  index.to(device), valid.to(device), tree)


def _lower_right(segments: list[Segment], up: tuple[int, ...], k: int, device) -> torch.Tensor:
    """A continuing segment's causal mask over its ancestors' tokens then its own (all of the
    ancestors', its own up to itself), shared by every layer's call."""
    own = segments[k].end - segments[k].start
    keys = own + sum(segments[a].end - segments[a].start for a in up)
    return torch.ones((own, keys), dtype=torch.bool, device=device).tril(keys - own)


def _attention(module, query, key, value, attention_mask, packed_bounds: tuple[int, ...] | None = None,
               packed_tree=None, **kwargs):
    """transformers' SDPA attention, run once per packed segment when the call is packed: causal
    and without a mask for a whole sequence, over its ancestors' keys too for a continuing segment."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is not None or packed_bounds is None or query.size(0) != 1 or (
            packed_tree is None and len(packed_bounds) <= 2):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # split, not slices: a slice's backward writes its gradient into a zeroed full-length tensor, once
    # per sequence and projection; split's backward is one concatenation
    sizes = [b - a for a, b in zip(packed_bounds[:-1], packed_bounds[1:])]
    qs, ks, vs = (x.split(sizes, dim=2) for x in (query, key, value))
    parts = []
    for k, (q, kk, v) in enumerate(zip(qs, ks, vs)):
        up, mask = packed_tree[k] if packed_tree is not None else ((), None)
        if up:
            kk, v = torch.cat([ks[a] for a in up] + [kk], dim=2), torch.cat([vs[a] for a in up] + [v], dim=2)
            mask = mask[None, None]
        parts.append(sdpa_attention_forward(module, q, kk, v, mask, **kwargs)[0])
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
                                 labels=packed.labels, packed_bounds=packed.bounds,
                                 packed_tree=packed.tree)

    def rows(x: torch.Tensor) -> torch.Tensor:
        return torch.where(packed.valid, x[0][packed.index], torch.zeros((), dtype=x.dtype, device=x.device))

    return rows(logps), (rows(entropy) if entropy is not None else None)
