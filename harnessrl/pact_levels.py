"""PACT's reasoning-prefix curriculum, shared by the compiler (which stores every level of an
expert turn in tasks.parquet) and the trainer (which picks the level of the current step).
docs/methods.md, PACT: level(s) = 4 − min(4, ⌊5s/S⌋) **[R]**; level L reveals the first
⌈L/4 · n⌉ of the n safe segments, those before the first explicit call preview.
"""

from __future__ import annotations

import math
from typing import Any


def reasoning_level(step: int, total_steps: int) -> int:
    """L4 at the start of training, down to L0 (no reasoning) from step ⌈4S/5⌉ on."""
    return 4 - min(4, (5 * step) // max(total_steps, 1))


def reasoning_prefix(segments: list[dict[str, Any]] | None, level: int) -> str:
    """The revealed reasoning at `level`: a segment that previews the exact call, and every one
    after it, is never revealed (it would hand the model the answer it is trained to produce)."""
    safe: list[str] = []
    for seg in segments or []:
        if seg.get("explicit_call_preview"):
            break
        safe.append(seg["text"])
    return "\n\n".join(safe[: math.ceil(level / 4 * len(safe))])


def all_levels(segments: list[dict[str, Any]] | None) -> list[str]:
    """[L0, L1, L2, L3, L4] of one expert turn."""
    return [reasoning_prefix(segments, level) for level in range(5)]
