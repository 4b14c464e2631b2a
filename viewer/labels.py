"""Everything the viewer takes from the compiler's labelling, in one place: the token-class codes
of `samples.parquet` and a tokenizer's token text + token classes (docs/architecture.md).

Token text is made visible: a space shows as `·`, a tab as `→`, a line break as `↵` before the
break itself, and special tokens (`<|im_end|>`) are flagged so the page boxes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from harnessrl.samples import CLASS_NAMES

_VISIBLE = str.maketrans({" ": "·", "\t": "→", "\n": "↵\n", "\r": "␍"})


@dataclass
class Labeller:
    """A tokenizer's view of token ids: `pieces(ids)` → (visible text, is special) per token;
    `classes(completions, native tool calls)` → a class-code array per completion."""

    pieces: Callable[[np.ndarray], list[tuple[str, bool]]]
    classes: Callable[[list[np.ndarray], list[list[dict[str, Any]] | None]], list[np.ndarray]]
    vocab: int  # ids at or above this are not this tokenizer's: the recorded model used another


@lru_cache(maxsize=4)
def labeller(tokenizer_dir: str) -> Labeller:
    """The labeller of a tokenizer directory, built once per directory (the table of a 150k
    vocabulary takes a moment). The one function that calls the compiler's labelling."""
    from harnessrl.compiler.labels import batch_token_classes
    from harnessrl.compiler.tokentext import TokenText

    tt = TokenText.from_dir(tokenizer_dir)

    def pieces(ids: np.ndarray) -> list[tuple[str, bool]]:
        return [(tt.table[i].decode(errors="replace").translate(_VISIBLE), bool(tt.special[i]))
                if 0 <= i < len(tt.table) else (f"<{i}?>", True) for i in np.asarray(ids).tolist()]

    def classes(completions, natives):
        return batch_token_classes(completions, tt, natives)

    return Labeller(pieces, classes, len(tt.table))


def class_name(code: int) -> str:
    return CLASS_NAMES.get(int(code), "none")
