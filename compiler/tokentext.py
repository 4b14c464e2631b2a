"""Token id → bytes table of a tokenizer, for decoding completions with per-token byte offsets.

Built once per tokenizer (O(vocabulary)); decoding a batch is one numpy gather over the
vocabulary's bytes joined into one buffer, so labelling never calls the tokenizer per token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harnessrl.errors import UserError


def _bytes_to_unicode() -> dict[int, str]:
    """The byte ↔ printable-character map of byte-level BPE vocabularies (GPT-2 family)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping, extra = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


class TokenText:
    """Token id → bytes table of a tokenizer, for decoding with byte offsets."""

    def __init__(self, tokenizer: Any):
        """`tokenizer`: a transformers tokenizer or a `tokenizers.Tokenizer`."""
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        n = backend.get_vocab_size(with_added_tokens=True)
        added = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
        table: list[bytes] = []
        if type(backend.decoder).__name__ == "ByteLevel":
            to_byte = {c: b for b, c in _bytes_to_unicode().items()}
            for i in range(n):
                tok = backend.id_to_token(i)
                if i in added:
                    table.append(added[i].encode())
                elif tok is None:
                    table.append(b"")
                else:
                    table.append(bytes(to_byte.get(ch, 63) for ch in tok))
        else:  # e.g. SentencePiece: per-token decode (a split multi-byte character is approximate)
            table = [backend.decode([i], skip_special_tokens=False).encode() for i in range(n)]
        self.table = table
        self.lens = np.array([len(b) for b in table], dtype=np.int64)
        self.special = np.zeros(n, dtype=bool)
        self.special[list(added)] = True
        # the vocabulary as one byte buffer (+ a NUL "separator token" with id n): a batch of
        # completions decodes with one gather
        self.sep = n
        self.buffer = np.frombuffer(b"".join(table) + b"\x00", dtype=np.uint8)
        self.starts = np.concatenate([[0], np.cumsum(self.lens)]).astype(np.int64)
        self.lens_sep = np.concatenate([self.lens, [1]])
        self.special_sep = np.concatenate([self.special, [False]])

    @classmethod
    def from_dir(cls, path: str | Path) -> TokenText:
        """From a model/tokenizer directory; reads `tokenizer.json` directly when there is one
        (no transformers import: the compiler starts in a fraction of a second)."""
        path = Path(path)
        if (path / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            return cls(Tokenizer.from_file(str(path / "tokenizer.json")))
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(path))

    def decode(self, ids: np.ndarray) -> tuple[bytes, np.ndarray]:
        """Bytes of `ids` (the separator id gives a NUL byte) and the start offset of each token
        (plus the end: len(ids)+1 items)."""
        ids = np.asarray(ids, dtype=np.int64)
        lens = self.lens_sep[ids]
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        gather = np.repeat(self.starts[ids] - offsets[:-1], lens) + np.arange(offsets[-1])
        return self.buffer[gather].tobytes(), offsets


    def check_ids(self, ids: np.ndarray, where: str, tokenizer: str) -> None:
        """A UserError naming the tokenizer and the first id it has no token for."""
        if len(ids) and int(ids.max()) >= self.sep:
            bad = int(ids[ids >= self.sep][0])
            raise UserError(f"token id {bad} of {where} is outside the vocabulary of the tokenizer {tokenizer} "
                            f"({self.sep} tokens): compile with the tokenizer of the recorded model (--tokenizer)")
