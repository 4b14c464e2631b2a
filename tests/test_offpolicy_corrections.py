"""The off-policy corrections of docs/methods.md §6.5 beyond token-level TIS — sequence-level TIS,
masked IS with a band at token and at sequence level, IcePop's two-sided mask — and the
training–inference mismatch metrics, against numbers worked out by hand on the real trainer's
per-token loss; the metrics where the loop and the viewer show them.

The worked sample is tests/test_async_correction.py's: logp_old = (−1.0, −0.5, −2.0),
logp_behaviour = (−1.2, −1.5, −1.7), so d = logp_old − logp_behaviour = (0.2, 1.0, −0.3) and the
token ratios r = e^d = (1.221403, 2.718282, 0.740818); ρ = (1.5, 1.1, 0.5), A = 2, ε = 0.2, so the
clipped surrogate s = (−2.4, −2.2, −1.0) (token 1 clipped), token_mean over N = 3."""

import json
import math

import pytest
import torch
from test_async_correction import BEHAVIOUR, OLD, RHO, A, logged, loss_of, one_sample
from trainer_fixtures import make_trainer, write_samples

from harnessrl.errors import UserError
from harnessrl.trainer.config import TrainConfig
from harnessrl.trainer.grpo import HarnessTrainer
from harnessrl.trainer.losses import behaviour_weight, mismatch_kl

S = [-2.4, -2.2, -1.0]
R = [math.exp(0.2), math.e, math.exp(-0.3)]


def two_samples(root, model_dir, other_behaviour=(-1.0, -0.4, -2.1)):
    """Row 0 the worked sample (Σd = 0.9, r_seq = e^0.9 = 2.459603); row 1 the same tokens with
    logp_behaviour = (−1.0, −0.4, −2.1) by default: d = (0, −0.1, 0.1), Σd = 0, r_seq = 1."""
    _, row = one_sample(root / "one", model_dir, BEHAVIOUR)
    n = row["prompt_len"]
    other = dict(row, sample_id="r1/agent:solo/c2", rollout_id="r1", behaviour_logprob=[None] * n + list(other_behaviour))
    return write_samples(root / "two", [row, other])


def two_row_loss(tr):
    """(per-token loss, the step's loss) of both rows, ρ and logp_old as in the worked sample on each."""
    batch = tr.fixed_batch()
    assert [s.rollout_id for s in batch["samples"]] == ["r0", "r1"]
    old = torch.tensor([OLD, OLD])
    logps = old + torch.log(torch.tensor([RHO, RHO]))
    per_token, _ = tr.per_token_loss(logps, {**batch, "old_per_token_logps": old})
    assert torch.allclose(batch["loss_weights"], torch.full((2, 3), 1 / 6))  # token_mean over N = 6
    return per_token, float(tr.share(per_token, batch["loss_weights"]))


@pytest.mark.unit
def test_sequence_level_truncated_and_masked_is(tmp_path, tiny_model_dir):
    # Sequence level: one weight per row, r_seq = Π r_t = e^{Σd}: row 0 e^0.9 = 2.459603, row 1 e^0 = 1.
    #   truncate, C = 2: w = (2, 1) → ℓ row 0 = 2·s = (−4.8, −4.4, −2.0), row 1 = s;
    #     loss (−11.2 − 5.6)/6 = −2.8
    #   truncate, C = 3: w = (2.459603, 1) → loss (−5.6·2.459603 − 5.6)/6 = −3.228963
    #   mask, band [0, 2]: row 0 out (2.46 > 2) → w = (0, 1) → loss −5.6/6 = −0.933333
    # Token level, truncate C = 2, for contrast: row 0 w = (1.221403, 2, 0.740818) → Σℓ = −8.072185;
    #   row 1 w = (1, e^−0.1, e^0.1) → Σℓ = −2.4 − 1.990642 − 1.105171 = −5.495813; loss −13.567998/6 = −2.261333
    d = two_samples(tmp_path, tiny_model_dir)
    e09 = math.exp(0.9)
    cases = [(dict(tis_level="sequence"), [2.0, 1.0], -2.8),
             (dict(tis_level="sequence", tis_cap=3.0), [e09, 1.0], -3.228963),
             (dict(tis_level="sequence", tis_mode="mask"), [0.0, 1.0], -0.933333)]
    for kw, w, expected in cases:
        tr = make_trainer(HarnessTrainer, tiny_model_dir, d, tis=True, **kw)
        per_token, loss = two_row_loss(tr)
        assert per_token[0].tolist() == pytest.approx([w[0] * s for s in S], rel=1e-5), kw
        assert per_token[1].tolist() == pytest.approx([w[1] * s for s in S], rel=1e-5), kw
        assert loss == pytest.approx(expected, rel=1e-5), kw
        got = logged(tr)
        # a row's weight cut counts all 3 of its tokens: row 0 cut at C = 2 (3 of 6), not at C = 3
        assert got["behaviour/capped_frac"] == pytest.approx(0.0 if kw.get("tis_cap") else 0.5), kw
        assert got["behaviour/weight_mean"] == pytest.approx((3 * w[0] + 3 * w[1]) / 6, rel=1e-5), kw
    tr = make_trainer(HarnessTrainer, tiny_model_dir, d, tis=True)  # token level, the default
    _, loss = two_row_loss(tr)
    assert loss == pytest.approx(-13.567998 / 6, rel=1e-5)


@pytest.mark.unit
def test_sequence_band_masks_below_as_well(tmp_path, tiny_model_dir):
    # logp_behaviour = (−0.2, −0.5, −1.7): d = (−0.8, 0, −0.3), Σd = −1.1, r_seq = e^−1.1 = 0.332871.
    # Band [0.5, 2]: below → w = 0, loss 0, every token cut. Band [0.3, 2]: kept at w = 0.332871:
    # ℓ = 0.332871·s, loss −5.6·0.332871/3 = −0.621359; gradient −w·ρ·A/3 off the clipped token 1:
    # (0, −0.332871·1.1·2/3, −0.332871·0.5·2/3) = (0, −0.244105, −0.110957).
    d, _ = one_sample(tmp_path / "s", tiny_model_dir, [-0.2, -0.5, -1.7])
    tr = make_trainer(HarnessTrainer, tiny_model_dir, d, tis=True, tis_mode="mask", tis_level="sequence", tis_low=0.5)
    per_token, loss, _ = loss_of(tr)
    assert per_token[0].tolist() == [0.0, 0.0, 0.0] and float(loss.detach()) == 0.0
    assert logged(tr)["behaviour/capped_frac"] == 1.0
    tr = make_trainer(HarnessTrainer, tiny_model_dir, d, tis=True, tis_mode="mask", tis_level="sequence", tis_low=0.3)
    w = math.exp(-1.1)
    per_token, loss, logps = loss_of(tr)
    assert float(loss.detach()) == pytest.approx(-0.621359, rel=1e-5)
    loss.backward()
    assert logps.grad[0].tolist() == pytest.approx([0.0, -w * 1.1 * A / 3, -w * 0.5 * A / 3], abs=1e-6)


@pytest.mark.unit
def test_token_mask_band_and_icepop(tmp_path, tiny_model_dir):
    # Token-level mask, band [0.8, 2]: r = (1.221403, 2.718282, 0.740818) → token 2 above, token 3 below:
    #   w = (1.221403, 0, 0), ℓ = (−2.931367, 0, 0), loss −0.977122, 2 of 3 cut.
    # IcePop, its band [0.5, 5]: all inside, w = r: ℓ = (−2.931367, −5.980220, −0.740818), loss −9.652405/3
    #   = −3.217468; gradient off token 1 (clipped): (0, −e·1.1·2/3, −e^−0.3·0.5·2/3) = (0, −1.993407, −0.246939).
    d, _ = one_sample(tmp_path / "s", tiny_model_dir, BEHAVIOUR)
    tr = make_trainer(HarnessTrainer, tiny_model_dir, d, tis=True, tis_mode="mask", tis_low=0.8)
    per_token, loss, _ = loss_of(tr)
    assert per_token[0].tolist() == pytest.approx([-2.4 * R[0], 0.0, 0.0], rel=1e-5)
    assert float(loss.detach()) == pytest.approx(-0.977122, rel=1e-5)
    assert logged(tr)["behaviour/capped_frac"] == pytest.approx(2 / 3)
    tr = make_trainer(HarnessTrainer, tiny_model_dir, d, tis=True, tis_mode="icepop")
    per_token, loss, logps = loss_of(tr)
    assert per_token[0].tolist() == pytest.approx([s * r for s, r in zip(S, R)], rel=1e-5)
    assert float(loss.detach()) == pytest.approx(-3.217468, rel=1e-5)
    loss.backward()
    assert logps.grad[0].tolist() == pytest.approx([0.0, -1.993407, -0.246939], abs=1e-6)
    assert logged(tr)["behaviour/capped_frac"] == 0.0
    # IcePop at both edges: logp_behaviour = (−1.2, −3.0, −1.2): d = (0.2, 2.5, −0.8), r = (1.221403,
    # 12.182494, 0.449329): token 2 above 5, token 3 below 0.5 → w = (1.221403, 0, 0), loss −0.977122,
    # the same as `mask` with the band written out.
    far, _ = one_sample(tmp_path / "far", tiny_model_dir, [-1.2, -3.0, -1.2])
    for kw in (dict(tis_mode="icepop"), dict(tis_mode="mask", tis_low=0.5, tis_cap=5.0)):
        tr = make_trainer(HarnessTrainer, tiny_model_dir, far, tis=True, **kw)
        _, loss, _ = loss_of(tr)
        assert float(loss.detach()) == pytest.approx(-0.977122, rel=1e-5), kw


@pytest.mark.unit
def test_mismatch_metrics_hand_numbers_correction_off(tmp_path, tiny_model_dir):
    # k3 of KL(π_behaviour ‖ π_old) on the sampled tokens, e^d − d − 1:
    #   d = 0.2 → 0.021403;  d = 1.0 → 0.718282;  d = −0.3 → 0.040818;  mean 0.780503/3 = 0.260168.
    # Out of the default band [0, 2]: r = 2.718 only → 1/3; of IcePop's [0.5, 5]: none; of [0.8, 2]: 2/3.
    # Logged with the correction off (the round loop's default), the loss unweighted.
    d, _ = one_sample(tmp_path / "s", tiny_model_dir, BEHAVIOUR)
    for kw, out in ((dict(), 1 / 3), (dict(tis_mode="icepop"), 0.0), (dict(tis_mode="mask", tis_low=0.8), 2 / 3)):
        tr = make_trainer(HarnessTrainer, tiny_model_dir, d, **kw)
        per_token, _, _ = loss_of(tr)
        assert per_token[0].tolist() == pytest.approx(S, rel=1e-6)  # tis off: w = 1
        got = logged(tr)
        assert got["mismatch/kl"] == pytest.approx(0.260168, rel=1e-5)
        assert got["mismatch/out_of_band_frac"] == pytest.approx(out), kw
    # A token without a recorded log-prob is in neither: over the 2 known, (0.021403 + 0.040818)/2 = 0.031111
    d, _ = one_sample(tmp_path / "u", tiny_model_dir, [-1.2, math.nan, -1.7])
    tr = make_trainer(HarnessTrainer, tiny_model_dir, d)
    loss_of(tr)
    got = logged(tr)
    assert got["mismatch/kl"] == pytest.approx(0.031111, rel=1e-4) and got["mismatch/out_of_band_frac"] == 0.0
    # per token, the estimator: NaN where unknown
    kl = mismatch_kl(torch.tensor([-1.0, -0.5]), torch.tensor([-1.2, math.nan]))
    assert kl[0].item() == pytest.approx(math.exp(0.2) - 1.2, rel=1e-5) and math.isnan(kl[1].item())


@pytest.mark.unit
def test_mismatch_at_staleness_zero_on_the_real_model(tmp_path, tiny_model_dir):
    # Staleness 0: the sample's behaviour log-probs are the trainer's own for the same weights, so at
    # step 0 (logp_old = the detached log-probs) KL = 0 and no token is out of the band. An engine whose
    # log-probs run 0.1 above the trainer's on every token: d = −0.1, k3 = e^−0.1 + 0.1 − 1 = 0.004837.
    d, _ = one_sample(tmp_path / "s", tiny_model_dir, BEHAVIOUR)
    probe = make_trainer(HarnessTrainer, tiny_model_dir, d)
    with torch.no_grad():
        own = probe.policy_logps(probe.model, probe.fixed_batch())[0][0].tolist()
    for shift, kl in ((0.0, 0.0), (0.1, math.exp(-0.1) - 0.9)):
        same, _ = one_sample(tmp_path / f"same{shift}", tiny_model_dir, [v + shift for v in own])
        tr = make_trainer(HarnessTrainer, tiny_model_dir, same)
        tr.objective(tr.model, tr.fixed_batch())
        got = logged(tr)
        assert got["mismatch/kl"] == pytest.approx(kl, abs=1e-6)
        assert got["mismatch/out_of_band_frac"] == 0.0 and got["behaviour/unknown_frac"] == 0.0


@pytest.mark.unit
def test_mismatch_metrics_do_not_depend_on_the_split(tmp_path, tiny_model_dir):
    # Row 0 the worked sample, row 1 with logp_behaviour = (−1.0, unknown, −2.1): d = (0, ·, 0.1), so
    # row 1 counts 2 tokens. k3 per token: row 0 (0.021403, 0.718282, 0.040818), row 1 (0, 0.005171).
    # One micro-batch or two: Σ/Σ = 0.785674/5 = 0.157135, out of [0, 2] 1/5 — where the mean of the
    # two micro-batches' means would be (0.260168 + 0.002585)/2 = 0.131377 and (1/3 + 0)/2 = 1/6.
    d = two_samples(tmp_path, tiny_model_dir, (-1.0, None, -2.1))
    tr = make_trainer(HarnessTrainer, tiny_model_dir, d)
    whole = tr.fixed_batch()
    old = torch.tensor([OLD, OLD])
    tr.per_token_loss(old.clone(), {**whole, "old_per_token_logps": old})
    one = logged(tr)
    for i in (0, 1):
        part = tr.fixed_batch([i])
        tr.per_token_loss(old[i:i + 1].clone(), {**part, "old_per_token_logps": old[i:i + 1]})
    split = logged(tr)
    for name in ("mismatch/kl", "mismatch/out_of_band_frac"):
        assert one[name] == pytest.approx(split[name], rel=1e-6)
    assert one["mismatch/kl"] == pytest.approx(0.157135, rel=1e-4)
    assert one["mismatch/out_of_band_frac"] == pytest.approx(1 / 5)


@pytest.mark.unit
def test_behaviour_weight_shapes_and_config():
    # r = (3, 1.5, 0.5, unknown): token level, cap 2: truncate (2, 1.5, 0.5, 1); band [0.6, 2]: mask (0, 1.5, 0, 1)
    old = torch.zeros(4)
    b = torch.tensor([-math.log(3), -math.log(1.5), math.log(2), math.nan])
    w, cut = behaviour_weight(old, b, 2.0, "truncate")
    assert w.tolist() == pytest.approx([2.0, 1.5, 0.5, 1.0]) and cut.tolist() == [True, False, False, False]
    w, cut = behaviour_weight(old, b, 2.0, "mask", low=0.6)
    assert w.tolist() == pytest.approx([0.0, 1.5, 0.0, 1.0]) and cut.tolist() == [True, False, True, False]
    # truncate with a lower edge clamps up to it (TRL's clip_min): (2, 1.5, 0.6, 1)
    w, cut = behaviour_weight(old, b, 2.0, "truncate", low=0.6)
    assert w.tolist() == pytest.approx([2.0, 1.5, 0.6, 1.0]) and cut.tolist() == [True, False, True, False]
    # sequence level over rows; the unknown token counts 1 in the product and takes the row's weight:
    # row (3, 1.5, 0.5, ·) → r = 2.25 → truncate 2 on all four; a row with nothing known weighs 1
    w, _ = behaviour_weight(old.view(1, 4), b.view(1, 4), 2.0, "truncate", level="sequence")
    assert w[0].tolist() == pytest.approx([2.0] * 4)
    w, cut = behaviour_weight(torch.zeros(1, 2), torch.full((1, 2), math.nan), 2.0, "mask", 0.5, "sequence")
    assert w.tolist() == [[1.0, 1.0]] and not cut.any()
    # the loss mask limits the product to trained tokens: only token 1 (r = 3) → mask [0, 2] cuts the row
    w, _ = behaviour_weight(old.view(1, 4), b.view(1, 4), 2.0, "mask", level="sequence", mask=torch.tensor([[1.0, 0, 0, 0]]))
    assert w.tolist() == [[0.0] * 4]
    # the band each mode takes by default, and the one-line errors
    assert TrainConfig().tis_band() == (0.0, 2.0) and TrainConfig(tis_mode="mask").tis_band() == (0.0, 2.0)
    assert TrainConfig(tis_mode="icepop").tis_band() == (0.5, 5.0)
    assert TrainConfig(tis_mode="icepop", tis_cap=3.0, tis_low=0.25).tis_band() == (0.25, 3.0)
    for kw, match in ((dict(tis_level="row"), "tis_level"), (dict(tis_mode="icepop", tis_level="sequence"), "icepop"),
                      (dict(tis_mode="mask", tis_low=1.5), "tis_low"),
                      (dict(tis_mode="icepop", tis_cap=0.9), "tis_cap")):
        with pytest.raises(UserError, match=match):
            TrainConfig(**kw).validate()


@pytest.mark.unit
def test_mismatch_in_the_loop_tables_and_the_viewer(tmp_path):
    from harnessrl.app.loop.report import round_table, step_table
    from harnessrl.app.loop.state import LoopState
    from harnessrl.console import Console
    from harnessrl.viewer.runs import runs_view

    log = {"loss": 0.1, "mismatch/kl": 0.000123, "mismatch/out_of_band_frac": 0.0625}
    state = LoopState(model="m", initial_eval=0.5)
    state.rounds.append(dict(round=0, train_reward=0.5, train_success=0.5, tool_validity=1.0, eval_success=0.25,
                             tokens=10, samples=2, seconds=1.0, version="v1", train_log=log))
    state.rounds.append(dict(round=1, train_reward=0.5, train_success=0.5, tool_validity=1.0, eval_success=0.25,
                             tokens=10, samples=2, seconds=1.0, version="v2"))  # a loop from before the metric
    state.steps.append(dict(step=0, groups=["g0"], staleness=[0, 2], reward=0.5, success=0.5, samples=2,
                            seconds=1.0, version="v1", train_log=log))
    console = Console(width=250, record=True)
    console.print(round_table(state))
    console.print(step_table(state))
    text = console.export_text()
    assert "mismatch KL" in text and "out of band" in text
    assert text.count("1.23e-04") == 2 and text.count("0.062") == 2
    state.save(tmp_path / "loop_state.json")
    assert json.loads((tmp_path / "loop_state.json").read_text())["rounds"][0]["train_log"]["mismatch/kl"] == 0.000123
    view = runs_view(tmp_path)
    assert [(r["mismatch_kl"], r["out_of_band"]) for r in view["rounds"]] == [("1.23e-04", 0.0625), (None, None)]
    assert (view["steps"][0]["mismatch_kl"], view["steps"][0]["stale"]) == ("1.23e-04", "1.00/2")


@pytest.mark.unit
def test_pact_trace_rows_are_left_out_of_the_mismatch(tmp_path, tiny_model_dir):
    # PACT's trace rows (z = 0) score logp_old under c^h = [x; h*] while the server sampled their tokens
    # under x: their gap is the privileged block's effect, not the engine's, so the rows carry no
    # behaviour log-prob (w = 1 under tis) and every behaviour and mismatch metric skips them; they
    # count as unknown. q = 0: every row a trace row → no gap and no mismatch logged, unknown_frac 1;
    # q = 1: every row an anchor → the k3
    # mean over all trained tokens, each with logp_behaviour = −2 (the fixture's): mean(e^d − d − 1),
    # d = logp_old + 2, logp_old the step-0 log-probs.
    from trainer_fixtures import tiny_samples

    from harnessrl.trainer.pact import PactTrainer

    d = tiny_samples(tmp_path / "s", tiny_model_dir, traces=True)
    tr = make_trainer(PactTrainer, tiny_model_dir, d, algo="pact", pact_q=0.0, beta=0.0)
    tr.objective(tr.model, tr.fixed_batch())
    got = logged(tr)
    assert "behaviour/abs_gap" not in got and "mismatch/kl" not in got and got["behaviour/unknown_frac"] == 1.0
    tr = make_trainer(PactTrainer, tiny_model_dir, d, algo="pact", pact_q=1.0, beta=0.0)
    batch = tr.fixed_batch()
    assert bool((batch["gate"] == 1).all())
    with torch.no_grad():
        old = tr.policy_logps(tr.model, batch)[0]
    tr.objective(tr.model, batch)
    sel = batch["loss_mask"] > 0
    dd = (old + 2.0)[sel].double()
    assert logged(tr)["mismatch/kl"] == pytest.approx(float((dd.exp() - dd - 1).mean()), rel=1e-4)


def test_mismatch_logged_at_every_step_of_a_real_run(tmp_path, tiny_model_dir):
    # Two optimizer steps through TRL's own loop, sequence-level masked IS on: each step's log entry
    # carries both metrics (and the correction's own), and the loop's train_log keeps their mean.
    from trainer_fixtures import tiny_samples

    from harnessrl.app.loop.stages import train_log

    d = tiny_samples(tmp_path / "s", tiny_model_dir)
    tr = make_trainer(HarnessTrainer, tiny_model_dir, d, steps=2, batch_size=4, tis=True, tis_mode="mask",
                      tis_level="sequence", tis_low=0.5)
    tr.train()
    steps = [e for e in tr.state.log_history if "loss" in e]
    assert len(steps) == 2
    for e in steps:
        assert e["mismatch/kl"] > 0 and 0.0 <= e["mismatch/out_of_band_frac"] <= 1.0 and "behaviour/capped_frac" in e
    kept = train_log(tr.state.log_history)
    assert kept["mismatch/kl"] == pytest.approx((steps[0]["mismatch/kl"] + steps[1]["mismatch/kl"]) / 2)
