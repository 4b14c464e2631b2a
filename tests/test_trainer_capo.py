"""CAPO: partitions from probe activations, routed gradient = masked sum of the separate
gradients, the freeze guarantee under AdamW weight decay, loss terms, training lowers the loss."""

import json

import pytest
import torch
from trainer_fixtures import make_trainer, own_loss, start_logps, tiny_samples
from transformers import AutoModelForCausalLM, AutoTokenizer

from harnessrl.samples import ACTION, ARGS
from harnessrl.errors import UserError
from harnessrl.trainer.capo import CapoTrainer
from harnessrl.trainer.capo_partition import Partition, build_partition, probe_set, top_units, write_outputs
from harnessrl.trainer.data import load_samples


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("capo")
    samples = tiny_samples(root / "samples", tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    part, report = build_partition(model, load_samples(samples).samples, rho=0.25)
    paths = write_outputs(part, report, root / "part" / "partition.pt")
    return samples, paths


def test_partition_files_and_top_rho(setup, tiny_model_dir):
    samples, (pt, js, png) = setup
    part = Partition.load(pt)
    report = json.loads(js.read_text())
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    cfg = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config
    assert part.act.shape == part.args.shape == (cfg.num_hidden_layers, cfg.intermediate_size)
    # ρ = 0.25 of the units of every layer, per class
    assert (part.act.sum(1) == round(0.25 * cfg.intermediate_size)).all()
    assert (part.args.sum(1) == round(0.25 * cfg.intermediate_size)).all()
    for k in ("action", "args"):
        assert len(report["importance"][k]) == cfg.num_hidden_layers and abs(sum(report["importance"][k]) - 1) < 1e-5
    # probe set: the rewards alternate 1, 0 within each group → only rollouts with reward 1
    data = load_samples(samples)
    assert {s.outcome_reward for s in probe_set(data.samples)} == {1.0}
    assert report["probe_samples"] == len(data.samples) // 2


def test_top_units_and_layer_importance_hand_numbers():
    from harnessrl.trainer.capo_partition import layer_importance

    a = torch.tensor([[0.1, 0.9, 0.5, 0.3], [2.0, 0.0, 1.0, 1.0]])
    # ρ = 0.5 of 4 units → 2 per layer: layer 0 → units 1, 2; layer 1 → units 0 and (2 or 3)… use distinct values
    a[1, 3] = 0.5
    assert top_units(a, 0.5).tolist() == [[False, True, True, False], [True, False, True, False]]
    # s_l = Σ_u a_lu / Σ a: layer sums 1.8 and 3.5 of 5.3
    assert [round(x, 6) for x in layer_importance(a)] == [round(1.8 / 5.3, 6), round(3.5 / 5.3, 6)]


def _separate_grads(tr, batch, name):
    tr.model.zero_grad()
    t = tr.terms(tr.model, batch)[name]
    t.backward()
    out = {p: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for p in tr.model.parameters()}
    tr.model.zero_grad()
    return out


@pytest.mark.parametrize("gamma,other", [(0.0, True), (0.5, True), (0.0, False)])
def test_routed_gradient_is_masked_sum(setup, tiny_model_dir, gamma, other):
    samples, (pt, _, _) = setup
    tr = make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(pt), capo_gamma=gamma, capo_other=other)
    batch = tr.fixed_batch()
    g = {k: _separate_grads(tr, batch, k) for k in ("act", "args", "other")}
    tr.create_optimizer_and_scheduler(num_training_steps=1)
    tr.current_gradient_accumulation_steps = 1
    tr.model.train()
    tr.training_step(tr.model, [{"prompt": i} for i in range(len(tr.data.samples))], None)  # the same samples
    part = Partition.load(pt)
    mlps = dict(tr.model.named_modules())
    masks_act, masks_args = {}, {}
    for layer, name in enumerate(part.modules):
        m = mlps[name]
        for which, units, store in (("act", part.act, masks_act), ("args", part.args, masks_args)):
            u = units[layer].float()
            store[m.gate_proj.weight] = u[:, None].expand_as(m.gate_proj.weight)
            store[m.up_proj.weight] = u[:, None].expand_as(m.up_proj.weight)
            store[m.down_proj.weight] = u[None, :].expand_as(m.down_proj.weight)
    for p in tr.model.parameters():
        ma = masks_act.get(p, torch.zeros_like(p))
        mb = masks_args.get(p, torch.zeros_like(p))
        expected = (ma + gamma * (1 - ma)) * g["act"][p] + (mb + gamma * (1 - mb)) * g["args"][p] + (g["other"][p] if other else 0)
        got = p.grad if p.grad is not None else torch.zeros_like(p)
        assert torch.allclose(got, expected, atol=1e-6, rtol=1e-4)
    # the check is not vacuous: both routed terms and L_other contribute
    assert all(sum(float(v.abs().sum()) for v in g[k].values()) > 0 for k in ("act", "args", "other"))


def test_frozen_parameters_stay_bit_identical(setup, tiny_model_dir):
    samples, (pt, _, _) = setup
    tr = make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(pt), capo_other=False,
                      weight_decay=0.1, lr=1e-3, steps=3)
    start = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train()
    part = Partition.load(pt)
    inside = {}
    for layer, name in enumerate(part.modules):
        u = part.act[layer] | part.args[layer]
        inside[f"{name}.gate_proj.weight"] = u[:, None]
        inside[f"{name}.up_proj.weight"] = u[:, None]
        inside[f"{name}.down_proj.weight"] = u[None, :]
    moved_inside = 0
    for n, p in tr.model.named_parameters():
        if n in inside:
            keep = ~inside[n].expand_as(p)
            assert torch.equal(p.detach()[keep], start[n][keep]), n  # outside the partitions: untouched
            moved_inside += int((p.detach() != start[n]).sum())
        else:
            assert torch.equal(p.detach(), start[n]), n
    assert moved_inside > 0
    # optimizer state holds nothing for the frozen elements either
    opt = tr.optimizer.optimizer if hasattr(tr.optimizer, "optimizer") else tr.optimizer
    for n, p in tr.model.named_parameters():
        if n in inside and p in opt.state:
            keep = ~inside[n].expand_as(p)
            assert float(opt.state[p]["exp_avg"][keep].abs().sum()) == 0.0
    logs = tr.state.log_history[0]
    assert {"loss/act", "loss/args", "grad_norm/act", "grad_norm/args", "grad_cosine/act_args"} <= set(logs)


def test_capo_terms_hand_numbers(setup, tiny_model_dir):
    # With logp_old = logp (ratio 1) each term is −(mean advantage over its own tokens).
    samples, (pt, _, _) = setup
    tr = make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(pt))
    batch = tr.fixed_batch()
    t = tr.terms(tr.model, batch)
    m, cls, adv = batch["loss_mask"], batch["token_class"], batch["advantages"]
    for name, sel in (("act", cls == ACTION), ("args", cls == ARGS), ("other", (cls != ACTION) & (cls != ARGS))):
        w = m * sel
        assert torch.isclose(t[name], -(adv * w).sum() / w.sum(), atol=1e-6)


def test_capo_lowers_own_loss_and_rejects_foreign_partition(setup, tiny_model_dir, tmp_path):
    samples, (pt, _, _) = setup
    tr = make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(pt))
    batch = tr.fixed_batch()
    old = start_logps(tr, batch)
    before = own_loss(tr, batch, old)
    tr.train()
    assert tr.state.global_step == 2 and own_loss(tr, batch, old) < before - 1e-4
    bad = Partition(["model.layers.9.mlp"], torch.ones(1, 4, dtype=torch.bool), torch.ones(1, 4, dtype=torch.bool), {})
    bad.save(tmp_path / "bad.pt")
    with pytest.raises(UserError, match="not in this model"):
        make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(tmp_path / "bad.pt"))
    (tmp_path / "junk.pt").write_text("junk")
    with pytest.raises(UserError, match="not a CAPO partition"):
        make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(tmp_path / "junk.pt"))
