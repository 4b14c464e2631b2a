"""CAPO: partitions from probe activations (MLP units and attention heads), routed gradient = masked
sum of the separate gradients (shared remainder and the earlier leak rule), the static partition
file (built once, reused, an unrouted run without a success), the freeze guarantee of the leak rule
under AdamW weight decay, loss terms, training lowers the loss."""

import json

import pytest
import torch
from trainer_fixtures import make_trainer, own_loss, start_logps, tiny_samples
from transformers import AutoModelForCausalLM, AutoTokenizer

from harnessrl.samples import ACTION, ARGS
from harnessrl.errors import UserError
from harnessrl.trainer.capo import CapoTrainer
from harnessrl.trainer.capo_masks import partition_masks, withheld_masks
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
    # attention heads of every layer too: ⌈0.25 · 4 heads⌉ = 1 per layer and class
    assert part.act_heads.shape == part.args_heads.shape == (cfg.num_hidden_layers, cfg.num_attention_heads)
    assert (part.act_heads.sum(1) == 1).all() and (part.args_heads.sum(1) == 1).all()
    assert len(report["importance_heads"]["action"]) == cfg.num_hidden_layers
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


def test_partition_rules_hand_numbers():
    from harnessrl.trainer.capo_partition import class_masks

    # 3 layers × 2 units. Layer sums: action 2, 10, 4 of 16 → s_act = (0.125, 0.625, 0.25);
    # args 6, 12, 2 of 20 → s_args = (0.3, 0.6, 0.1)
    a = torch.tensor([[1.0, 1.0], [5.0, 5.0], [2.0, 2.0]])
    b = torch.tensor([[3.0, 3.0], [6.0, 6.0], [1.0, 1.0]])
    none, whole = [False, False], [True, True]
    # layers, ρ = 0.3: ⌈0.9⌉ = 1 layer each; both classes' shares rank layer 1 first → both own it
    act, args = class_masks(a, b, 0.3, "layers")
    assert act.tolist() == args.tolist() == [none, whole, none]
    # ρ = 0.5: ⌈1.5⌉ = 2 layers: action 1 and 2 (0.625, 0.25); args 1 and 0 (0.6, 0.3)
    act, args = class_masks(a, b, 0.5, "layers")
    assert act.tolist() == [none, whole, whole] and args.tolist() == [whole, whole, none]
    # layers_contrast: s_act − s_args = (−0.175, 0.025, 0.15) → action layer 2; args the converse → layer 0
    act, args = class_masks(a, b, 0.3, "layers_contrast")
    assert act.tolist() == [none, none, whole] and args.tolist() == [whole, none, none]
    # the unit rules (departures) take ⌈ρ·U⌉ units of every layer: ρ = 0.5 → 1 of 2 in each layer
    u_a = torch.tensor([[1.0, 2.0], [4.0, 3.0]])
    u_b = torch.tensor([[0.5, 2.5], [1.0, 0.5]])
    act, args = class_masks(u_a, u_b, 0.5, "activation")
    assert act.tolist() == [[False, True], [True, False]] and args.tolist() == [[False, True], [True, False]]
    # contrast: a − b = (0.5, −0.5; 3, 2.5) → unit 0 of each layer; b − a the converse → unit 1
    act, args = class_masks(u_a, u_b, 0.5, "contrast")
    assert act.tolist() == [[True, False], [True, False]] and args.tolist() == [[False, True], [False, True]]


def test_layers_rule_builds_whole_layers(tiny_model_dir, tmp_path):
    samples = tiny_samples(tmp_path / "s", tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    part, report = build_partition(model, load_samples(samples).samples, rho=0.25, by="layers")
    n_layers = model.config.num_hidden_layers
    # ⌈0.25 · layers⌉ whole layers per class, for MLP units and for heads alike
    for m in (part.act, part.args, part.act_heads, part.args_heads):
        rows = m.sum(1)
        assert ((rows == 0) | (rows == m.size(1))).all() and int((rows > 0).sum()) == max(1, -(-n_layers // 4))
    assert report["by"] == "layers"
    # the action layer is the one with the largest action importance
    assert int(part.act.any(1).nonzero()[0]) == max(range(n_layers), key=lambda i: report["importance"]["action"][i])
    assert all(0.0 <= o <= 1.0 for o in report["overlap_per_layer"])  # no 0/0 where the action owns no unit


def test_capo_rule_from_train_config(tiny_model_dir, tmp_path):
    from harnessrl.trainer.config import TrainConfig, load_config

    with pytest.raises(UserError, match="unknown capo_rule 'whole'"):
        TrainConfig(algo="capo", partition="p.pt", capo_rule="whole").validate()
    cfg_file = tmp_path / "train.yaml"  # the file `loop --train-config` hands every round
    cfg_file.write_text("capo_rule: layers_contrast\n")
    assert load_config(cfg_file, {"algo": "capo", "partition": "p.pt"}).capo_rule == "layers_contrast"
    samples = tiny_samples(tmp_path / "s", tiny_model_dir)
    path = tmp_path / "part.pt"
    tr = make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(path), capo_rule="layers")
    assert tr.partition.meta["by"] == "layers"
    rows = tr.partition.act.sum(1)
    assert ((rows == 0) | (rows == tr.partition.act.size(1))).all()
    # unset: the file is taken as made; another rule named: refused, not trained with silently
    assert make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(path)).partition.meta["by"] == "layers"
    with pytest.raises(UserError, match="made by rule 'layers', not capo_rule 'contrast'"):
        make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(path), capo_rule="contrast")
    redo = make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(path), capo_rule="contrast",
                        capo_partition_refresh=True)
    assert redo.partition.meta["by"] == "contrast"


def _separate_grads(tr, batch, name):
    tr.model.zero_grad()
    t = tr.terms(tr.model, batch)[name]
    t.backward()
    out = {p: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for p in tr.model.parameters()}
    tr.model.zero_grad()
    return out


def _masks_by_hand(model, part, which, units):
    """The partition's 0/1 mask per parameter, full size, written out independently of capo_masks."""
    mods = dict(model.named_modules())
    out = {}
    for layer, name in enumerate(part.modules):
        m, u = mods[name], getattr(part, which)[layer].float()
        out[m.gate_proj.weight] = u[:, None].expand_as(m.gate_proj.weight)
        out[m.up_proj.weight] = u[:, None].expand_as(m.up_proj.weight)
        out[m.down_proj.weight] = u[None, :].expand_as(m.down_proj.weight)
    if units == "heads_mlp":
        for layer, name in enumerate(part.attn_modules):
            a, h = mods[name], getattr(part, f"{which}_heads")[layer].float()  # 4 heads of 16, 2 kv heads
            q = h.repeat_interleave(16)
            kv = torch.stack([h[0:2].max(), h[2:4].max()]).repeat_interleave(16)  # kv head j serves heads 2j, 2j+1
            out[a.q_proj.weight] = q[:, None].expand_as(a.q_proj.weight)
            out[a.q_proj.bias] = q
            for proj in (a.k_proj, a.v_proj):
                out[proj.weight] = kv[:, None].expand_as(proj.weight)
                out[proj.bias] = kv
            out[a.o_proj.weight] = q[None, :].expand_as(a.o_proj.weight)
    return out


@pytest.mark.parametrize("units,remainder,gamma,other", [
    ("heads_mlp", "shared", 0.0, True), ("heads_mlp", "shared", 0.3, False), ("mlp", "shared", 0.0, True),
    ("heads_mlp", "shared-from-terms", 0.1, True), ("mlp", "leak", 0.0, True), ("mlp", "leak", 0.5, True),
    ("mlp", "leak", 0.0, False)])
def test_routed_gradient_is_masked_sum(setup, tiny_model_dir, units, remainder, gamma, other):
    # shared: R_act = 1 − (1−γ)·M_args·(1−M_act) (withheld only on the args partition less the action
    # one; the remainder and the shared units keep it all); leak: R_act = M_act + γ(1 − M_act).
    samples, (pt, _, _) = setup
    tr = make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(pt), capo_gamma=gamma,
                      capo_other=other, capo_units=units, capo_remainder=remainder.removesuffix("-from-terms"))
    if remainder.endswith("-from-terms"):  # no hook on the final hidden state: the corrections from the loss terms
        tr.model.model.norm._forward_hooks.clear()
        remainder = "shared"
    batch = tr.fixed_batch()
    g = {k: _separate_grads(tr, batch, k) for k in ("act", "args", "other")}
    tr.create_optimizer_and_scheduler(num_training_steps=1)
    tr.current_gradient_accumulation_steps = 1
    tr.model.train()
    tr.training_step(tr.model, [{"prompt": i} for i in range(len(tr.data.samples))], None)  # the same samples
    part = Partition.load(pt)
    masks_act, masks_args = (_masks_by_hand(tr.model, part, w, units) for w in ("act", "args"))
    withheld = 0.0
    for p in tr.model.parameters():
        ma = masks_act.get(p, torch.zeros_like(p))
        mb = masks_args.get(p, torch.zeros_like(p))
        if remainder == "shared":
            r_act, r_args = 1 - (1 - gamma) * mb * (1 - ma), 1 - (1 - gamma) * ma * (1 - mb)
        else:
            r_act, r_args = ma + gamma * (1 - ma), mb + gamma * (1 - mb)
        expected = r_act * g["act"][p] + r_args * g["args"][p] + (g["other"][p] if other else 0)
        got = p.grad if p.grad is not None else torch.zeros_like(p)
        assert torch.allclose(got, expected, atol=1e-6, rtol=1e-4)
        withheld += float(((1 - r_act) * g["act"][p]).abs().sum())
    # the check is not vacuous: both routed terms and L_other contribute, and routing withholds some
    assert all(sum(float(v.abs().sum()) for v in g[k].values()) > 0 for k in ("act", "args", "other"))
    assert withheld > 0


def test_withheld_masks_hand_numbers():
    # 4 rows: action owns rows 0 and 3, args rows 1 and 3. C_act = M_args(1 − M_act) = [0, 1, 0, 0]
    # (row 3 is in both: shared; row 2 in neither: the remainder, both update it),
    # C_args = M_act(1 − M_args) = [1, 0, 0, 0].
    p = torch.nn.Parameter(torch.zeros(4, 2))
    (q, c_act, c_args), = withheld_masks({p: torch.tensor([1.0, 0, 0, 1])[:, None]}, {p: torch.tensor([0.0, 1, 0, 1])[:, None]})
    assert q is p and c_act.flatten().tolist() == [0, 1, 0, 0] and c_args.flatten().tolist() == [1, 0, 0, 0]
    # with γ = 0.25: g = ∇L_act + ∇L_args − 0.75(C_act⊙∇L_act + C_args⊙∇L_args); ∇L_act = 1, ∇L_args = 2 everywhere
    g = 1 + 2 - 0.75 * (c_act * 1 + c_args * 2)
    assert g.flatten().tolist() == [1.5, 2.25, 3.0, 3.0]  # row 0: 1 + 0.25·2; row 1: 0.25·1 + 2; rows 2, 3: 1 + 2


def test_head_masks_follow_the_gqa_groups(setup, tiny_model_dir):
    # tiny model: 4 query heads of 16 dims, 2 key/value heads (kv head 0 serves query heads 0, 1).
    _, (pt, _, _) = setup
    part = Partition.load(pt)
    part.act_heads = torch.tensor([[False, True, False, False]] * 2)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    m = partition_masks(model, part, "act", "heads_mlp")
    attn = model.model.layers[0].self_attn
    assert m[attn.q_proj.weight].flatten().nonzero().flatten().tolist() == list(range(16, 32))  # head 1's rows
    assert m[attn.k_proj.weight].flatten().nonzero().flatten().tolist() == list(range(0, 16))  # kv head 0's rows
    assert m[attn.v_proj.bias].nonzero().flatten().tolist() == list(range(0, 16))
    assert m[attn.o_proj.weight].shape == (1, 64) and m[attn.o_proj.weight][0].nonzero().flatten().tolist() == list(range(16, 32))
    assert model.model.embed_tokens.weight not in m  # the embeddings (and the tied head) are the shared remainder
    assert set(partition_masks(model, part, "act", "mlp")) == {p for layer in model.model.layers for p in layer.mlp.parameters()}


def test_static_partition_built_once_reused_and_unrouted_without_success(tiny_model_dir, tmp_path):
    # absent + a success in the samples → built from them and saved; present → loaded as it is (a
    # marker put into its meta survives); absent + no success → this run trains unrouted, nothing saved.
    samples = tiny_samples(tmp_path / "s", tiny_model_dir)
    path = tmp_path / "part.pt"
    tr = make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(path))
    assert path.is_file() and tr.partition.meta["probe_samples"] == 2 and tr.routes
    part = Partition.load(path)
    part.meta["marker"] = 7
    part.save(path)
    again = make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(path))
    assert again.partition.meta["marker"] == 7
    rebuilt = make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(path), capo_partition_refresh=True)
    assert "marker" not in rebuilt.partition.meta
    failed = tiny_samples(tmp_path / "f", tiny_model_dir, rewards=[0.0] * 4)
    none = make_trainer(CapoTrainer, tiny_model_dir, failed, algo="capo", partition=str(tmp_path / "none.pt"))
    assert none.partition is None and none.routes == [] and not (tmp_path / "none.pt").exists()
    none.train()  # trains (unrouted), never aborts
    assert none.state.global_step == 2
    # a stored partition is reused by a run without a success (and with refresh asked for)
    reuse = make_trainer(CapoTrainer, tiny_model_dir, failed, algo="capo", partition=str(path), capo_partition_refresh=True)
    assert reuse.partition is not None and reuse.routes


def test_frozen_parameters_stay_bit_identical(setup, tiny_model_dir):
    samples, (pt, _, _) = setup
    # the earlier rule (capo_units: mlp, capo_remainder: leak, γ = 0, no L_other) freezes everything
    # outside the MLP partitions
    tr = make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(pt), capo_other=False,
                      capo_units="mlp", capo_remainder="leak", capo_gamma=0.0, weight_decay=0.1, lr=1e-3, steps=3)
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
    assert {"loss/act", "loss/args", "grad_norm/act", "grad_norm/args"} <= set(logs)


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
    assert {"grad_norm/act_withheld", "grad_norm/args_withheld"} <= set(tr.state.log_history[0])
    bad = Partition(["model.layers.9.mlp"], torch.ones(1, 4, dtype=torch.bool), torch.ones(1, 4, dtype=torch.bool), {})
    bad.save(tmp_path / "bad.pt")
    with pytest.raises(UserError, match="not in this model"):
        make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(tmp_path / "bad.pt"))
    (tmp_path / "junk.pt").write_text("junk")
    with pytest.raises(UserError, match="not a CAPO partition"):
        make_trainer(CapoTrainer, tiny_model_dir, samples, algo="capo", partition=str(tmp_path / "junk.pt"))
