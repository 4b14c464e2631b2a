"""A small Okapi BM25 index (Robertson/Sparck Jones idf with the +1 that keeps it positive).

score(q, d) = Σ_{t∈q} idf(t) · f(t,d)·(k1+1) / (f(t,d) + k1·(1 − b + b·|d|/avgdl)),
idf(t) = ln(1 + (N − n(t) + 0.5) / (n(t) + 0.5)).
"""

from __future__ import annotations

import math
import re
from collections import Counter

_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


class BM25Index:
    def __init__(self, texts: list[str], k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self._tf = [Counter(tokenize(t)) for t in texts]
        self._len = [sum(tf.values()) for tf in self._tf]
        self._avgdl = (sum(self._len) / len(self._len)) if self._len else 0.0
        df: Counter[str] = Counter()
        for tf in self._tf:
            df.update(tf.keys())
        n = len(texts)
        self.idf = {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}
        # term -> documents containing it, so a query touches only its postings
        self._postings: dict[str, list[int]] = {}
        for i, tf in enumerate(self._tf):
            for t in tf:
                self._postings.setdefault(t, []).append(i)

    def __len__(self) -> int:
        return len(self._tf)

    def score(self, query: str, doc: int) -> float:
        tf, norm = self._tf[doc], self.k1 * (1 - self.b + self.b * self._len[doc] / self._avgdl)
        return sum(self.idf[t] * tf[t] * (self.k1 + 1) / (tf[t] + norm) for t in tokenize(query) if tf.get(t))

    def top_k(self, query: str, k: int = 3) -> list[tuple[int, float]]:
        """The k best documents with a positive score, best first (ties: lower index first)."""
        candidates = {i for t in set(tokenize(query)) for i in self._postings.get(t, ())}
        scored = [(i, self.score(query, i)) for i in candidates]
        scored.sort(key=lambda p: (-p[1], p[0]))
        return scored[:k]
