"""MatchTIR hard credit assignment (docs/methods.md §7, PACT appendix): predicted calls are matched
one-to-one to reference calls and each predicted call is rewarded with its pair's similarity."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment


def similarity(pred_name: str | None, pred_args: dict[str, Any] | None,
               ref_name: str, ref_args: dict[str, Any]) -> float:
    """S_ab = 0 if the names differ (case-insensitive), else
    (1 + keyJaccard + #{k ∈ G_b : P_a[k] == G_b[k]}) / (2 + |G_b|)."""
    if not pred_name or pred_name.lower() != ref_name.lower():
        return 0.0
    p = pred_args or {}
    union = set(p) | set(ref_args)
    jaccard = len(set(p) & set(ref_args)) / len(union) if union else 1.0  # both empty: same keys
    exact = sum(1 for k, v in ref_args.items() if k in p and p[k] == v)
    return (1.0 + jaccard + exact) / (2.0 + len(ref_args))


def similarity_matrix(pred: list[tuple[str | None, dict[str, Any] | None]],
                      ref: list[tuple[str, dict[str, Any]]]) -> np.ndarray:
    return np.array([[similarity(pn, pa, rn, ra) for rn, ra in ref] for pn, pa in pred],
                    dtype=np.float64).reshape(len(pred), len(ref))


def match(sim: np.ndarray, method: str = "hungarian") -> list[int]:
    """For each predicted call, the index of its matched reference call, or -1.
    `hungarian`: maximum total similarity; `greedy`: repeatedly the highest remaining pair
    (the reference code's matcher). Pairs with S = 0 count as unmatched."""
    out = [-1] * sim.shape[0]
    if sim.size == 0:
        return out
    if method == "hungarian":
        rows, cols = linear_sum_assignment(sim, maximize=True)
        pairs = zip(rows.tolist(), cols.tolist())
    elif method == "greedy":
        order = np.argsort(-sim, axis=None, kind="stable")
        used_r, used_c, chosen = set(), set(), []
        for flat in order.tolist():
            r, c = divmod(flat, sim.shape[1])
            if r not in used_r and c not in used_c:
                used_r.add(r)
                used_c.add(c)
                chosen.append((r, c))
        pairs = iter(chosen)
    else:
        raise ValueError(f"unknown matcher {method!r}")
    for r, c in pairs:
        if sim[r, c] > 0:
            out[r] = c
    return out


def call_rewards(pred: list[tuple[str | None, dict[str, Any] | None]],
                 ref: list[tuple[str, dict[str, Any]]],
                 method: str = "hungarian", penalty: float = 0.0) -> list[float]:
    """r(p_a) = S_ab for a matched pair, else −λ_pen."""
    sim = similarity_matrix(pred, ref)
    return [float(sim[a, b]) if b >= 0 else -penalty for a, b in enumerate(match(sim, method))]


def turn_rewards(turn_calls: list[list[float]], final_turn: int | None, final_f1: float) -> list[float]:
    """Per turn: the mean of its calls' rewards (0 with no call); the final-answer turn gets
    the answer's token F1."""
    out = [float(np.mean(r)) if r else 0.0 for r in turn_calls]
    if final_turn is not None:
        out[final_turn] = final_f1
    return out


def reference_calls(raw: list[Any] | None) -> list[tuple[str, dict[str, Any]]]:
    """A task's reference calls ({name, arguments} or OpenAI {function: {...}}) as pairs."""
    out = []
    for item in raw or []:
        f = item.get("function", item)
        args = f.get("arguments") or {}
        if isinstance(args, str):
            args = json.loads(args or "{}")
        out.append((str(f["name"]), dict(args)))
    return out
