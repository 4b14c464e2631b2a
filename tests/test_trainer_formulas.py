"""Formula tests with hand-worked numbers: padding and alignment of per-token columns, log-probs under
left padding, truncated IS on the right token, β·KL in the loss, CAPO activation statistics and
top-ρ units on the 2-layer tiny model."""

import math

import pytest
import torch
from trainer_fixtures import make_rows, make_trainer, prepend_prompt, start_logps, tiny_samples, write_samples
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOTrainer

from harnessrl.samples import ACTION, ARGS
from harnessrl.trainer.capo_partition import activation_stats, top_units
from harnessrl.trainer.data import Sample, collate, load_samples
from harnessrl.trainer.grpo import HarnessTrainer

pytestmark = pytest.mark.unit
NAN = math.nan


def _sample(sid, ids, prompt_len, mask, behaviour, cls=None):
    n = len(ids)
    return Sample(sid, sid, "t", "t", "a", 0.0, ids, mask, cls or [0] * n, [float(m) for m in mask], behaviour, prompt_len)


def test_collate_left_pads_prompts_and_aligns_behaviour_hand_numbers():
    # s0: ids 11..15, prompt 2 → completion [13, 14, 15], loss [1, 0, 1], behaviour [−0.5, nan, −1.5]
    # s1: ids 21..24, prompt 3 → completion [24],         loss [1],       behaviour [−0.25]
    # P = max(2, 3) = 3, C = max(3, 1) = 3; pad id 0.
    s0 = _sample("s0", [11, 12, 13, 14, 15], 2, [0, 0, 1, 0, 1], [NAN, NAN, -0.5, NAN, -1.5])
    s1 = _sample("s1", [21, 22, 23, 24], 3, [0, 0, 0, 1], [NAN, NAN, NAN, -0.25])
    b = collate([s0, s1], pad_id=0)
    assert b["prompt_ids"].tolist() == [[0, 11, 12], [21, 22, 23]]  # left padding
    assert b["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert b["completion_ids"].tolist() == [[13, 14, 15], [24, 0, 0]]  # right padding
    assert b["completion_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert b["loss_mask"].tolist() == [[1, 0, 1], [1, 0, 0]]
    # Distinct values: a one-token shift (e.g. [nan, −0.5, nan]) fails here.
    got = b["behaviour_logps"]
    assert got[0, 0] == -0.5 and torch.isnan(got[0, 1]) and got[0, 2] == -1.5
    assert got[1, 0] == -0.25 and torch.isnan(got[1, 1:]).all()
    assert b["advantages"].tolist() == [[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]]


@pytest.fixture(scope="module")
def graded(tmp_path_factory, tiny_model_dir):
    """Samples whose behaviour log-probs differ from token to token, −1 − 0.05·(t mod 11) at position t,
    and whose prompts differ in length (rows 1 and 3 start with a system message)."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    system = tok("<|im_start|>system\nAnswer briefly.<|im_end|>\n", add_special_tokens=False)["input_ids"]
    rows = [prepend_prompt(r, system) if i % 2 else r for i, r in enumerate(make_rows(tok, n_tasks=2, k=2))]
    for r in rows:
        r["behaviour_logprob"] = [(-1.0 - 0.05 * (t % 11) if m else None) for t, m in enumerate(r["loss_mask"])]
    return write_samples(tmp_path_factory.mktemp("graded"), rows)


def test_tis_weight_takes_the_behaviour_logprob_of_the_same_token(graded, tiny_model_dir):
    # At ratio 1 the surrogate of completion token j of row i is −A·w with
    # w = min(exp(logp_old(j) − b), 2), b the behaviour log-prob recorded for input position P_i + j.
    # E.g. logp_old = −3.1, b = −1.2 → w = e^{−1.9} = 0.1496; logp_old = −0.4, b = −1.0 → e^{0.6} = 1.822.
    tr = make_trainer(HarnessTrainer, tiny_model_dir, graded, tis=True, tis_cap=2.0)
    batch = tr.fixed_batch()
    old = start_logps(tr, batch)
    per_token, _ = tr.per_token_loss(old.clone(), {**batch, "old_per_token_logps": old})
    checked = 0
    for i, s in enumerate(tr.data.samples):
        for j in range(len(s.input_ids) - s.prompt_len):
            t = s.prompt_len + j
            if not s.loss_mask[t]:
                continue
            w = min(math.exp(float(old[i, j]) - s.behaviour_logprob[t]), 2.0)
            assert float(per_token[i, j]) == pytest.approx(-s.advantage[t] * w, rel=1e-5, abs=1e-6), (i, j)
            checked += 1
    assert checked > 50


def test_ratio_to_behaviour_clips_against_the_recorded_sampling_logprob(graded, tiny_model_dir):
    # ratio_to=behaviour: ρ = exp(logp_θ − b) with b the recorded sampling log-prob, so the clip bounds
    # the whole round's drift from the sampling policy. E.g. logp = −1.5, b = −1.0: ρ = e^{−0.5} = 0.6065;
    # A = +1 → −min(0.6065, 0.8) = −0.6065; A = −1 → −min(−0.6065, −0.8) = 0.8 (clipped: no gradient).
    # Where no behaviour log-prob was recorded (NaN), logp_old stays the step's start: ρ = 1, loss −A.
    tr = make_trainer(HarnessTrainer, tiny_model_dir, graded, ratio_to="behaviour")
    batch = tr.fixed_batch()
    logps = start_logps(tr, batch).clone().requires_grad_(True)
    per_token, old = tr.per_token_loss(logps, batch)
    per_token[batch["loss_mask"] > 0].sum().backward()
    clipped = recorded = unrecorded = 0
    for i, s in enumerate(tr.data.samples):
        for j in range(len(s.input_ids) - s.prompt_len):
            t, a = s.prompt_len + j, float(batch["advantages"][i, j])
            b = s.behaviour_logprob[t]
            if b is None or math.isnan(b):
                assert float(per_token[i, j]) == pytest.approx(-a, abs=1e-6), (i, j)
                unrecorded += 1
                continue
            rho = math.exp(float(logps.detach()[i, j]) - b)
            assert float(old[i, j]) == pytest.approx(b)
            assert float(per_token[i, j]) == pytest.approx(-min(rho * a, min(max(rho, 0.8), 1.2) * a), rel=1e-5, abs=1e-6)
            if s.loss_mask[t] and a != 0 and (rho * a > min(max(rho, 0.8), 1.2) * a):
                assert float(logps.grad[i, j]) == 0.0  # the clipped side carries no gradient
                clipped += 1
            recorded += 1
    assert recorded > 50 and clipped > 0 and unrecorded > 0


def test_negative_weight_scales_only_negative_advantages(graded, tiny_model_dir):
    # negative_weight w: A < 0 becomes w·A, A ≥ 0 stays. At the step's start ρ = 1, so the per-token
    # loss is −A' exactly: e.g. A = −0.5, w = 0.25 → 0.125; A = +0.5 → −0.5. The gradient of a
    # negative token is w times what it is at w = 1 (here ∂loss/∂logp = −A' at ρ = 1).
    full = make_trainer(HarnessTrainer, tiny_model_dir, graded)
    tr = make_trainer(HarnessTrainer, tiny_model_dir, graded, negative_weight=0.25)
    batch = tr.fixed_batch()
    logps = start_logps(tr, batch).clone().requires_grad_(True)
    per_token, _ = tr.per_token_loss(logps, batch)
    per_token[batch["loss_mask"] > 0].sum().backward()
    ref_logps = logps.detach().clone().requires_grad_(True)
    ref, _ = full.per_token_loss(ref_logps, batch)
    ref[batch["loss_mask"] > 0].sum().backward()
    mask, adv = batch["loss_mask"] > 0, batch["advantages"]
    seen = {"neg": 0, "pos": 0}
    for i, j in mask.nonzero().tolist():
        a = float(adv[i, j])
        if a == 0:
            continue
        w = 0.25 if a < 0 else 1.0
        assert float(per_token.detach()[i, j]) == pytest.approx(-w * a, abs=1e-6)
        assert float(logps.grad[i, j]) == pytest.approx(w * float(ref_logps.grad[i, j]), abs=1e-7)
        seen["neg" if a < 0 else "pos"] += 1
    assert seen["neg"] > 10 and seen["pos"] > 10


def test_unknown_ratio_to_or_optimizer_is_a_user_error():
    from harnessrl.errors import UserError
    from harnessrl.trainer.config import TrainConfig

    with pytest.raises(UserError, match="ratio_to"):
        TrainConfig(ratio_to="rollout").validate()
    with pytest.raises(UserError, match="optim"):
        TrainConfig(optim="adam_typo").validate()
    with pytest.raises(UserError, match="pact"):
        TrainConfig(algo="pact", ratio_to="behaviour").validate()
    with pytest.raises(UserError, match="negative_weight"):
        TrainConfig(negative_weight=-0.5).validate()


def test_sgd_moves_each_parameter_in_proportion_to_its_gradient(graded, tiny_model_dir):
    # optim=sgd, lr 0.5, no momentum: after one step every parameter moved by exactly −0.5·g
    tr = make_trainer(HarnessTrainer, tiny_model_dir, graded, optim="sgd", lr=0.5, steps=1)
    tr.create_optimizer_and_scheduler(num_training_steps=1)
    assert type(tr.optimizer.optimizer if hasattr(tr.optimizer, "optimizer") else tr.optimizer) is torch.optim.SGD
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.model.train()
    tr.objective(tr.model, tr.fixed_batch())["loss"].backward()
    grads = {n: p.grad.detach().clone() for n, p in tr.model.named_parameters() if p.grad is not None}
    tr.optimizer.step()
    assert len(grads) > 10
    for n, p in tr.model.named_parameters():
        if n in grads:
            assert torch.allclose(p.detach(), before[n] - 0.5 * grads[n], atol=1e-7), n


def test_logps_under_left_padding_equal_unpadded_forward(graded, tiny_model_dir):
    # Row i is left-padded by P − p_i. Token t of a sample is predicted by the logits at t − 1, so
    # completion token j (input position p_i + j) is scored from position p_i + j − 1 of the
    # unpadded sequence, and from P + j − 1 of the padded row.
    tr = make_trainer(HarnessTrainer, tiny_model_dir, graded)
    batch = tr.fixed_batch()
    assert (batch["prompt_mask"] == 0).any()  # some rows are really left-padded
    padded = start_logps(tr, batch)
    model = tr.model
    for i, s in enumerate(tr.data.samples):
        ids = torch.tensor([s.input_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        logp = torch.log_softmax(logits[:-1], -1).gather(1, ids[0, 1:, None])[:, 0]
        c = len(s.input_ids) - s.prompt_len
        own = logp[s.prompt_len - 1:]  # the log-probs of tokens p_i … end
        assert torch.allclose(padded[i, :c], own, atol=2e-5), (i, float((padded[i, :c] - own).abs().max()))


def test_beta_kl_is_added_to_the_loss(graded, tiny_model_dir):
    # ratio 1 and ref = logp − 0.5: d = ref − logp = −0.5, k3 = e^{−0.5} − (−0.5) − 1 = 0.606531 + 0.5 − 1 = 0.106531;
    # ℓ = −A + β·k3 = −A + 0.1·0.106531 per token → loss = −token_mean(A) + 0.0106531.
    tr = make_trainer(HarnessTrainer, tiny_model_dir, graded, beta=0.1)
    batch = tr.fixed_batch()
    logp = start_logps(tr, batch)
    inputs = {**batch, "old_per_token_logps": logp, "ref_per_token_logps": logp - 0.5}
    with torch.no_grad():
        ours = tr.objective(tr.model, inputs)["loss"]
    m, adv = batch["loss_mask"], batch["advantages"]
    assert float(ours) == pytest.approx(float(-(adv * m).sum() / m.sum()) + 0.1 * 0.1065306597, abs=1e-6)
    tr.loss_type = "bnpo"  # TRL composes β·KL the same way
    trl_inputs = {k: batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")}
    trl_inputs.update(tool_mask=m, old_per_token_logps=logp, ref_per_token_logps=logp - 0.5, num_items_in_batch=m.sum())
    with torch.no_grad():
        theirs = GRPOTrainer._compute_loss(tr, tr.model, trl_inputs)
    assert float(ours) == pytest.approx(float(theirs), abs=1e-6)


def test_top_units_is_the_ceiling_hand_numbers():
    score = torch.tensor([[0.0, 9, 1, 8, 2, 7, 3, 6, 4, 5]])
    # ρ = 0.25 of 10 units: ⌈2.5⌉ = 3 → units 1, 3, 5 (scores 9, 8, 7); round(2.5) would give 2.
    assert top_units(score, 0.25)[0].nonzero().flatten().tolist() == [1, 3, 5]
    # ρ = 0.3: 0.3·10 = 3.0000000000000004 in floating point, still 3 units.
    assert int(top_units(score, 0.3).sum()) == 3
    # ρ = 0.01: ⌈0.1⌉ = 1, never 0.
    assert top_units(score, 0.01)[0].nonzero().flatten().tolist() == [1]


def test_capo_activation_stats_by_hand_on_two_layers(tmp_path, tiny_model_dir):
    # a^k_{l,u} = mean over class-k probe tokens t of |h_{l,u}(t − 1)|, h = act(gate(x))·up(x) with x
    # the MLP input of layer l: token t is produced at position t − 1. Two samples with different
    # prompt lengths, so the padded batch shifts one of them.
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.num_hidden_layers == 2
    samples = load_samples(tiny_samples(tmp_path, tiny_model_dir, n_tasks=2, k=1, rewards=[1.0, 1.0])).samples
    samples[1] = _sample("long", [samples[1].input_ids[0]] * 3 + samples[1].input_ids, samples[1].prompt_len + 3,
                         [0] * 3 + samples[1].loss_mask, [NAN] * 3 + samples[1].behaviour_logprob, [0] * 3 + samples[1].token_class)
    got = activation_stats(model, samples)

    mlps = [layer.mlp for layer in model.model.layers]
    want = {"action": [], "args": []}
    late = []  # args read one position late, at t: must differ
    for s in samples:
        xs = []
        hooks = [m.register_forward_pre_hook(lambda _m, a: xs.append(a[0][0].detach())) for m in mlps]
        with torch.no_grad():
            model(input_ids=torch.tensor([s.input_ids]))
        for h in hooks:
            h.remove()
        acts = [(m.act_fn(m.gate_proj(x)) * m.up_proj(x)).abs() for m, x in zip(mlps, xs)]  # (T, units) per layer
        for name, code in (("action", ACTION), ("args", ARGS)):
            for t in range(s.prompt_len, len(s.input_ids)):
                if s.loss_mask[t] and s.token_class[t] == code:
                    want[name].append(torch.stack([a[t - 1] for a in acts]))  # (layers, units)
                    if code == ARGS:
                        late.append(torch.stack([a[t] for a in acts]))
    for name in ("action", "args"):
        expect = torch.stack(want[name]).mean(0)
        assert got[name].shape == expect.shape == (2, model.config.intermediate_size)
        assert torch.allclose(got[name], expect, atol=1e-5), name
    assert not torch.allclose(got["args"], torch.stack(late).mean(0), atol=1e-3)  # the check is not vacuous
