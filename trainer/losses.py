"""Per-token terms shared by every objective (docs/methods.md §6 common).

ρ = exp(logp_θ − logp_old);  ℓ = −min(ρA, clip(ρ, 1−ε_lo, 1+ε_hi)A);
KL: k3 estimator exp(ref − logp) − (ref − logp) − 1 (TRL's);
behaviour weight (§6.5): r = exp(logp_old − logp_behaviour) per token, or its product over a
sequence's tokens; truncated to min(max(r, L), H) (TIS: L = 0), or masked to r·1[L ≤ r ≤ H] (masked
IS, IcePop's band);
1 where the behaviour log-prob is unknown (the proximal policy stands in for the behaviour)."""

from __future__ import annotations

import torch

def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return -torch.min(ratio * adv, clipped * adv)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def behaviour_weight(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, high: float, mode: str = "truncate",
                     low: float = 0.0, level: str = "token", mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, cut): the detached weight π_old/π_behaviour of §6.5 and where the cap or band changed it.

    level "token": r_t per token; "sequence": one r per row (the last dim is the sequence), the
    product of r_t over the row's trained tokens (`mask`) with a recorded log-prob, applied to all of
    them. mode "truncate": r clamped to [low, high] (TIS: low = 0, min(r, high)); "mask" / "icepop": r
    inside [low, high], 0 outside (masked IS; IcePop is its token-level two-sided form). NaN
    behaviour → r_t = 1 (uncut)."""
    log_r = old_logp.detach() - behaviour_logp
    known = ~torch.isnan(behaviour_logp)
    if level == "sequence":
        trained = known if mask is None else known & (mask > 0)
        # a sum of log-ratios, not a product of ratios: 100 tokens at r_t = 2 overflow no float32
        log_r = torch.where(trained, log_r, torch.zeros_like(log_r)).sum(-1, keepdim=True).expand_as(log_r)
        known = torch.ones_like(known)  # every token of the row takes the row's weight (1 when none was known)
    elif level != "token":
        raise ValueError(f"unknown tis_level {level!r}")
    r = torch.exp(log_r)
    if mode == "truncate":
        cut = (r < low) | (r > high)
        w = r.clamp(min=low, max=high)  # low = 0 by default: min(r, high), TIS's one-sided cap
    elif mode in ("mask", "icepop"):
        cut = (r < low) | (r > high)
        w = torch.where(cut, torch.zeros_like(r), r)
    else:
        raise ValueError(f"unknown tis_mode {mode!r}")
    cut = cut & known  # NaN compares False already; explicit for the sequence case's padding
    return torch.where(known, w, torch.ones_like(w)), cut


def tis_weight(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float, mode: str = "truncate", low: float = 0.0) -> torch.Tensor:
    """Token-level `behaviour_weight`'s w: "truncate" min(w, cap) (TIS), "mask" w inside [low, cap]
    and 0 outside (MIS: a token that far off the behaviour policy teaches nothing); NaN behaviour → 1."""
    return behaviour_weight(old_logp, behaviour_logp, cap, mode, low)[0]


def mismatch_kl(old_logp: torch.Tensor, behaviour_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π_behaviour ‖ π_old) on tokens sampled from π_behaviour (the
    inference engine): with d = logp_old − logp_behaviour, e^d − d − 1 ≥ 0, unbiased because
    E_behaviour[e^d] = 1. NaN where the behaviour log-prob is unknown."""
    return k3_kl(behaviour_logp, old_logp.detach())


def clipped_tokens(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """How many trainable tokens the clip holds (their gradient is 0): the clip ratio's numerator."""
    ratio = torch.exp(logp.detach() - old_logp)
    clipped = ((ratio < 1 - eps_low) & (adv < 0)) | ((ratio > 1 + eps_high) & (adv > 0))
    return (clipped.float() * mask).sum()
