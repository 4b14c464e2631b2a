"""Shared loss terms, aggregation modes and PACT schedules against hand-worked numbers."""

import math

import pytest
import torch

from harnessrl.trainer.data import aggregate
from harnessrl.trainer.losses import clipped_surrogate, k3_kl, tis_weight
from harnessrl.pact_levels import reasoning_level, reasoning_prefix
from harnessrl.trainer.pact import gate, lambda_a

pytestmark = pytest.mark.unit


def test_clipped_surrogate_hand_numbers():
    # ε = 0.2: clip range [0.8, 1.2]
    # ρ=1.5, A= 2: min(3.0, 1.2·2=2.4) = 2.4  → ℓ = −2.4
    # ρ=1.5, A=−1: min(−1.5, −1.2) = −1.5     → ℓ = 1.5
    # ρ=0.5, A= 1: min(0.5, 0.8) = 0.5        → ℓ = −0.5
    # ρ=0.5, A=−1: min(−0.5, −0.8) = −0.8     → ℓ = 0.8
    # ρ=1.0, A= 3: ℓ = −3
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.0])
    adv = torch.tensor([2.0, -1.0, 1.0, -1.0, 3.0])
    got = clipped_surrogate(torch.log(ratio), torch.zeros(5), adv, 0.2, 0.2)
    assert torch.allclose(got, torch.tensor([-2.4, 1.5, -0.5, 0.8, -3.0]), atol=1e-6)
    # asymmetric ε_hi = 0.28 (DAPO-style): ρ=1.5, A=2 → min(3.0, 1.28·2=2.56) → −2.56
    assert math.isclose(float(clipped_surrogate(torch.log(torch.tensor(1.5)), torch.tensor(0.0), torch.tensor(2.0), 0.2, 0.28)), -2.56, rel_tol=1e-6)


def test_k3_kl_and_tis_hand_numbers():
    # logp = ln 0.5, ref = ln 0.25: d = ref − logp = ln 0.5 = −0.693147; e^d − d − 1 = 0.5 + 0.693147 − 1 = 0.193147
    kl = k3_kl(torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25])))
    assert math.isclose(float(kl), 0.193147, rel_tol=1e-5)
    # old − behaviour = 1 → e^1 = 2.718 capped at 2; = −1 → e^−1 = 0.367879; unknown (NaN) → 1
    w = tis_weight(torch.tensor([-1.0, -2.0, -1.0]), torch.tensor([-2.0, -1.0, float("nan")]), cap=2.0)
    assert torch.allclose(w, torch.tensor([2.0, 0.367879, 1.0]), atol=1e-6)


def test_aggregation_modes_hand_numbers():
    # rows (rollout): r0 = [1,2,3] mask [1,1,0] (rollout 0); r1 = [4,0,0] mask [1,0,0] (rollout 1);
    # r2 = [6,8,0] mask [1,1,0] (rollout 1); r3 has no token.
    loss = torch.tensor([[1.0, 2, 3], [4, 0, 0], [6, 8, 0], [9, 9, 9]])
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0], [1, 1, 0], [0, 0, 0]])
    rollout = torch.tensor([0, 1, 1, 2])
    # token_mean: (1+2+4+6+8)/5 = 4.2
    assert math.isclose(float(aggregate(loss, mask, "token_mean")), 4.2, rel_tol=1e-6)
    # seq_mean over samples with tokens: (1.5 + 4 + 7)/3 = 4.1667
    assert math.isclose(float(aggregate(loss, mask, "seq_mean")), 12.5 / 3, rel_tol=1e-6)
    # rollout_mean: rollout 0 → 1.5; rollout 1 → (4+6+8)/3 = 6; rollout 2 empty → (1.5 + 6)/2 = 3.75
    assert math.isclose(float(aggregate(loss, mask, "rollout_mean", rollout)), 3.75, rel_tol=1e-6)
    with pytest.raises(ValueError):
        aggregate(loss, mask, "sum")


def test_pact_schedules_hand_numbers():
    # λ_a(s) = 0.8 − 0.6·min(s/S, 1), S = 10
    assert [round(lambda_a(s, 10), 6) for s in (0, 5, 10, 20)] == [0.8, 0.5, 0.2, 0.2]
    # level(s) = 4 − min(4, ⌊5s/10⌋): s=0→4, 1→4 (⌊0.5⌋=0), 2→3, 4→2, 6→1, 8→0, 10→0
    assert [reasoning_level(s, 10) for s in (0, 1, 2, 4, 6, 8, 10)] == [4, 4, 3, 2, 1, 0, 0]
    segs = [{"text": "a"}, {"text": "b"}, {"text": "call {json}", "explicit_call_preview": True}, {"text": "c"}]
    # 2 safe segments before the first preview: level ℓ shows ⌈ℓ/4·2⌉ of them
    assert [reasoning_prefix(segs, lvl) for lvl in range(5)] == ["", "a", "a", "a\n\nb", "a\n\nb"]


def test_pact_gate_seeded_per_task_per_step():
    draws = [gate(0, f"task{i}", 3, 0.4) for i in range(4000)]
    assert draws == [gate(0, f"task{i}", 3, 0.4) for i in range(4000)]  # reproducible
    assert abs(sum(draws) / len(draws) - 0.4) < 0.03  # P(z=1) = q (binomial sd ≈ 0.008)
    other_step = [gate(0, f"task{i}", 4, 0.4) for i in range(4000)]
    assert other_step != draws  # redrawn every step
    assert all(gate(0, f"t{i}", 0, 0.0) == 0 for i in range(100)) and all(gate(0, f"t{i}", 0, 1.0) == 1 for i in range(100))
