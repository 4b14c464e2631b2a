"""Per-token terms shared by every objective (docs/methods.md §6 common).

ρ = exp(logp_θ − logp_old);  ℓ = −min(ρA, clip(ρ, 1−ε_lo, 1+ε_hi)A);
KL: k3 estimator exp(ref − logp) − (ref − logp) − 1 (TRL's);
behaviour weight (§6.5): w = exp(logp_old − logp_behaviour), truncated to min(w, C) or masked to 0 where
w > C; 1 where the behaviour log-prob is unknown (the proximal policy stands in for the behaviour)."""

from __future__ import annotations

import torch


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return -torch.min(ratio * adv, clipped * adv)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def tis_weight(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float, mode: str = "truncate") -> torch.Tensor:
    """Detached per-token weight π_old/π_behaviour: "truncate" min(w, cap) (TIS), "mask" w, or 0 where
    w > cap (MIS: a token that far off the behaviour policy teaches nothing); NaN behaviour → 1."""
    w = torch.exp(old_logp.detach() - behaviour_logp)
    if mode == "truncate":
        w = w.clamp(max=cap)
    elif mode == "mask":
        w = torch.where(w > cap, torch.zeros_like(w), w)
    else:
        raise ValueError(f"unknown tis_mode {mode!r}")
    return torch.where(torch.isnan(behaviour_logp), torch.ones_like(w), w)


def clipped_tokens(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """How many trainable tokens the clip holds (their gradient is 0): the clip ratio's numerator."""
    ratio = torch.exp(logp.detach() - old_logp)
    clipped = ((ratio < 1 - eps_low) & (adv < 0)) | ((ratio > 1 + eps_high) & (adv > 0))
    return (clipped.float() * mask).sum()
