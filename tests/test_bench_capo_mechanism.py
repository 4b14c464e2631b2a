"""bench/capo_mechanism.py's math on a 2-parameter linear toy, against hand-worked numbers.

w = (w1, w2) starts at (1, 1). The "action" loss L_act = w1 + 2·w2 has ∇L_act = (1, 2); the "args"
loss L_args = 3·w1 − w2 has ∇L_args = (3, −1).
- cos = (3 − 2) / (√5 · √10) = 1/√50 ≈ 0.1414.
- SGD args step at lr 0.1: Δw = (−0.3, +0.1), so ΔL_act = −0.3 + 0.2 = −0.1 (= −lr·⟨∇L_act, ∇L_args⟩):
  the args step helps the action; ΔL_args = −0.9 − 0.1 = −1.0; ‖Δw‖ = √0.1.
- Adam's first step at lr 0.01 moves each weight by −lr·sign(g): Δw = (−0.01, +0.01), so
  ΔL_act = −0.01 + 0.02 = +0.01 (the same args step now erodes the action objective).
- Routing that withholds the args gradient from w1 (R_args = (0, 1)): R_args⊙∇L_args = (0, −1),
  cos with ∇L_act = −2/√5 ≈ −0.894, and the SGD step Δw = (0, +0.1) gives ΔL_act = +0.2."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from capo_mechanism import cosine, param_groups, routed, step_effect  # noqa: E402

pytestmark = pytest.mark.unit


@pytest.fixture
def toy():
    w1, w2 = torch.nn.Parameter(torch.tensor(1.0)), torch.nn.Parameter(torch.tensor(1.0))
    params = [w1, w2]
    g_act = {w1: torch.tensor(1.0), w2: torch.tensor(2.0)}
    g_args = {w1: torch.tensor(3.0), w2: torch.tensor(-1.0)}

    def measure():
        with torch.no_grad():
            return {"L_act": float(w1 + 2 * w2), "L_args": float(3 * w1 - w2)}

    return params, g_act, g_args, measure


def test_cosine_hand_numbers(toy):
    params, g_act, g_args, _ = toy
    assert cosine(g_act, g_args, params) == pytest.approx(1 / math.sqrt(50))
    assert cosine(g_act, g_act, params) == pytest.approx(1.0)
    assert cosine(g_act, {p: -g for p, g in g_act.items()}, params) == pytest.approx(-1.0)
    assert math.isnan(cosine(g_act, {p: torch.tensor(0.0) for p in params}, params))  # a zero gradient: undefined
    assert cosine(g_act, g_args, params[:1]) == pytest.approx(1.0)  # over w1 alone: (1)·(3) / (1·3)


def test_sgd_args_step_moves_the_action_loss_by_hand_numbers(toy):
    params, _, g_args, measure = toy
    eff = step_effect(params, g_args, "sgd", 0.1, measure)
    assert eff["L_act"] == pytest.approx(-0.1)
    assert eff["L_args"] == pytest.approx(-1.0)
    assert eff["step_norm"] == pytest.approx(math.sqrt(0.1))
    assert [float(p.detach()) for p in params] == [1.0, 1.0] and all(p.grad is None for p in params)  # put back


def test_adam_first_step_is_a_sign_step(toy):
    params, _, g_args, measure = toy
    eff = step_effect(params, g_args, "adam", 0.01, measure)
    assert eff["L_act"] == pytest.approx(0.01, rel=1e-5)  # −0.01 on w1, +0.01 on w2 (·2)
    assert eff["L_args"] == pytest.approx(-0.04, rel=1e-5)  # −0.03 − 0.01
    assert [float(p.detach()) for p in params] == [1.0, 1.0]


def test_routing_turns_the_args_step_against_the_action(toy):
    params, g_act, g_args, measure = toy
    r = routed(g_args, {params[0]: torch.tensor(0.0)})  # withheld from w1; w2 has no entry: R = 1
    assert [float(r[p]) for p in params] == [0.0, -1.0]
    assert cosine(g_act, r, params) == pytest.approx(-2 / math.sqrt(5))
    assert step_effect(params, r, "sgd", 0.1, measure)["L_act"] == pytest.approx(0.2)


def test_param_groups_split_a_tied_model_once():
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn, self.mlp, self.input_layernorm = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.LayerNorm(2)

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(5, 2)
            self.layers = torch.nn.ModuleList([Layer(), Layer()])
            self.lm_head = torch.nn.Linear(2, 5, bias=False)
            self.lm_head.weight = self.embed_tokens.weight  # tied: counted once

    g = param_groups(Toy())
    assert len(g["all"]) == 1 + 2 * 6 and len(g["embed"]) == 1
    assert len(g["attn"]) == len(g["mlp"]) == len(g["norm"]) == 4 and len(g["layer0"]) == len(g["layer1"]) == 6
    assert len(g["layers"]) == 12
