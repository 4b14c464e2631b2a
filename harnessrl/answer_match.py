"""Answer scoring shared by the compiler's outcome rewards and the example harnesses: SQuAD
normalisation, exact match, token F1 and ToolHop's "contains" (docs/methods.md, Rewards).

A reference may be a string, a list of accepted strings (aliases; the best match counts) or an
object with an `answer` field.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def references(reference: Any) -> list[str]:
    if reference is None:
        return []
    if isinstance(reference, (list, tuple)):
        return [str(r) for r in reference]
    if isinstance(reference, dict) and "answer" in reference:
        return references(reference["answer"])
    return [str(reference)]


def _f1_one(pred: str, ref: str) -> float:
    p, r = normalize_answer(pred).split(), normalize_answer(ref).split()
    common = sum((Counter(p) & Counter(r)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(r)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, reference: Any) -> float:
    return max((float(normalize_answer(prediction) == normalize_answer(r)) for r in references(reference)),
               default=0.0)


def f1(prediction: str, reference: Any) -> float:
    """Token-level F1 after SQuAD normalisation."""
    return max((_f1_one(prediction, r) for r in references(reference)), default=0.0)


def contains(prediction: str, reference: Any) -> float:
    """ToolHop AC: 1 if the normalised reference occurs in the normalised prediction."""
    pred = normalize_answer(prediction)
    return max((float(bool(normalize_answer(r)) and normalize_answer(r) in pred) for r in references(reference)),
               default=0.0)
