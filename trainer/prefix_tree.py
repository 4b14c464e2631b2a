"""A micro-batch's sequences as a tree of segments, so that each prefix several of them share is
computed once (docs/methods.md, "Shared prefixes").

A segment is a run of token depths [start, end) that every sequence in `rows` holds alike; a
segment continues its `parent` (its tokens attend to the parent's, and to the parent's
ancestors'). Where sequences part at depth e, the shared segment ends at e − 1 and each branch
starts at e − 1: the last shared token is repeated in every branch, because the position that
predicts a branch's first own token (e) must see that branch only. Segments come parent first,
and a parent's first child right after it, so that the packed position after the parent's last
one holds the token that position predicts (the fused head reads its label there)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# a shared run shorter than this stays in each sequence: below it, the repeated token and the
# extra attention call cost about what sharing saves
MIN_SHARED = 16
# a continuing segment attends through a boolean mask of len × (len + its ancestors' length) cells,
# one per segment, shared by the layers (16M cells: 16 MiB, and about 3 bytes a cell more inside
# each SDPA call on CPU). A longer branch of a long prefix (coding-CLI sessions) is not shared: on
# these kernels its attention, most of its cost, would not shrink (docs/benchmarks.md › Shared prefixes)
MAX_MASK = 1 << 24


@dataclass(frozen=True)
class Segment:
    start: int  # depth, in every sequence through it, of its first token
    end: int
    rows: tuple[int, ...]
    parent: int  # index of the segment it continues; -1 for a root


def prefix_tree(seqs: list[torch.Tensor], min_shared: int = MIN_SHARED, max_mask: int = MAX_MASK) -> list[Segment]:
    """The segments of non-empty 1-D token sequences: each run of at least `min_shared` tokens
    that two or more share becomes one segment, unless a continuation's mask (its length × the
    length up to its end) could pass `max_mask` cells."""
    segments: list[Segment] = []

    def place(rows: list[int], d: int, parent: int) -> None:
        if len(rows) == 1:
            segments.append(Segment(d, seqs[rows[0]].numel(), (rows[0],), parent))
            return
        e = _common_end(seqs, rows, d)
        masks = max((seqs[r].numel() - e + 1) * seqs[r].numel() for r in rows)
        if e - 1 - d >= min_shared and masks <= max_mask:
            segments.append(Segment(d, e - 1, tuple(rows), parent))
            parent, d = len(segments) - 1, e - 1
        for group in _parting(seqs, rows, e):  # each group holds alike at least one token more
            place(group, d, parent)

    place([i for i, s in enumerate(seqs) if s.numel()], 0, -1)
    return segments


def _common_end(seqs: list[torch.Tensor], rows: list[int], d: int) -> int:
    """The first depth ≥ d where the rows differ, or the shortest one ends."""
    end = min(seqs[r].numel() for r in rows)
    first = seqs[rows[0]][d:end]
    for r in rows[1:]:
        differ = torch.nonzero(seqs[r][d:end] != first)
        if differ.numel():
            end = d + int(differ[0])
            first = first[:end - d]
    return end


def _parting(seqs: list[torch.Tensor], rows: list[int], e: int) -> list[list[int]]:
    """Rows grouped by their token at depth e, in first-seen order; a row that ends at e alone."""
    groups: dict[object, list[int]] = {}
    for r in rows:
        key = int(seqs[r][e]) if seqs[r].numel() > e else ("ends", r)
        groups.setdefault(key, []).append(r)
    return list(groups.values())


def ancestry(segments: list[Segment]) -> list[tuple[int, ...]]:
    """Each segment's ancestors, root first."""
    out: list[tuple[int, ...]] = []
    for s in segments:
        out.append(() if s.parent < 0 else out[s.parent] + (s.parent,))
    return out
