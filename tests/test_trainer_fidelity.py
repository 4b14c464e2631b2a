"""Fidelity to the papers across a loop round (docs/methods.md §6, §6.4): logp_old taken at the round's
start (the ratio acts from the second optimizer step on), the KL reference fixed at the initial
policy in a later round, PACT's L_SFT scored at temperature 1, and the notice when the expert traces
carry no reasoning for the level schedule to act on."""

import logging

import pytest
import torch
from trainer_fixtures import EXPERT_TRACE, make_rows, make_trainer, tiny_samples, write_samples
from transformers import AutoModelForCausalLM, AutoTokenizer

from harnessrl.trainer.grpo import HarnessTrainer
from harnessrl.trainer.pact import PactTrainer


def _record(tr) -> list[dict]:
    """Every (step, logp, logp_old, samples) the trainer's surrogate sees."""
    seen = []
    inner = tr.per_token_loss

    def spy(logps, inputs):
        loss, old = inner(logps, inputs)
        seen.append(dict(step=tr.state.global_step, logps=logps.detach().clone(), old=old.detach().clone(),
                         mask=inputs["loss_mask"].clone(), ids=[s.sample_id for s in inputs["samples"]]))
        return loss, old

    tr.per_token_loss = spy
    return seen


@pytest.mark.parametrize("cls,kw", [(HarnessTrainer, {}), (PactTrainer, dict(algo="pact", pact_q=0.0))])
def test_ratio_acts_from_the_second_step_of_a_round(tmp_path, tiny_model_dir, cls, kw):
    # ratio_to: round. Step 0: logp_old = logp (the policy has not moved), ρ = 1 on every token.
    # Step 1: logp_old is the round-start policy's log-prob of the same token (for PACT under the same
    # privileged context c^h), while logp_θ is after one step of lr 1e-3: ρ = exp(logp_θ − logp_old) ≠ 1.
    # With ratio_to: step, logp_old is re-taken at step 1's start: ρ = 1 again.
    samples = tiny_samples(tmp_path / "s", tiny_model_dir, traces=cls is PactTrainer)
    start = make_trainer(cls, tiny_model_dir, samples, lr=1e-3, **kw)
    initial = start.round_start_logps()  # the logp_old of step 1, scored before any step
    tr = make_trainer(cls, tiny_model_dir, samples, lr=1e-3, **kw)
    seen = _record(tr)
    tr.train()
    assert [s["step"] for s in seen] == [0, 1]
    m0, m1 = (seen[k]["mask"] > 0 for k in (0, 1))
    assert torch.equal(seen[0]["old"][m0], seen[0]["logps"][m0])  # ρ = 1 at step 0
    ratio = torch.exp(seen[1]["logps"] - seen[1]["old"])[m1]
    assert float((ratio - 1).abs().max()) > 1e-3  # the clip has something to act on
    assert torch.allclose(seen[1]["old"], initial[(1, 0)], atol=1e-6)  # the round-start policy's log-probs
    step = make_trainer(cls, tiny_model_dir, samples, lr=1e-3, ratio_to="step", **kw)
    seen = _record(step)
    step.train()
    assert torch.equal(seen[1]["old"][m1], seen[1]["logps"][m1])  # ρ = 1 again: TRL's inert clip


def test_kl_reference_in_a_later_round_is_the_initial_policy(tmp_path, tiny_model_dir):
    # Round 1 trains from round 0's checkpoint; with ref_model = the initial model its reference
    # log-probs are the initial model's (not the checkpoint's, TRL's default: the policy at the run's start).
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for p in model.model.layers.parameters():
            p.add_(0.05 * torch.randn_like(p))
    moved = tmp_path / "round0-checkpoint"
    model.save_pretrained(moved)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(moved)
    samples = tiny_samples(tmp_path / "s", tiny_model_dir)
    fixed = make_trainer(HarnessTrainer, moved, samples, beta=0.01, ref_model=str(tiny_model_dir))
    drifting = make_trainer(HarnessTrainer, moved, samples, beta=0.01)
    initial = make_trainer(HarnessTrainer, tiny_model_dir, samples, beta=0.01)
    batch = fixed.fixed_batch()
    with torch.no_grad():
        want = initial.policy_logps(initial.model, batch)[0]
        policy = fixed.policy_logps(fixed.model, batch)[0]
    m = batch["loss_mask"] > 0
    assert torch.allclose(batch["ref_per_token_logps"][m], want[m], atol=1e-5)
    assert torch.allclose(drifting.fixed_batch()["ref_per_token_logps"][m], policy[m], atol=1e-5)
    assert float((want - policy)[m].abs().max()) > 1e-3  # the two references differ: the check is not vacuous


def test_sft_is_scored_at_temperature_one(tmp_path, tiny_model_dir):
    # L_SFT,i = −Σ_n m_n log softmax(z_n)[h*_n] / Σ m_n with the logits z at T = 1, though the RL
    # log-probs (and the fused head) use the sampling temperature 0.7: log softmax(z/0.7) would differ.
    samples = tiny_samples(tmp_path / "s", tiny_model_dir, traces=True)
    tr = make_trainer(PactTrainer, tiny_model_dir, samples, algo="pact", pact_q=0.0, beta=0.0, temperature=0.7)
    batch = tr.fixed_batch()
    with torch.no_grad():
        got = tr.sft_losses(tr.model, batch)
    checked = 0
    for i in range(len(got)):
        n = int(batch["sft_mask"][i].sum())
        w = batch["sft_weights"][i, 1:n]
        if float(w.sum()) == 0:
            assert float(got[i]) == 0.0
            continue
        ids = batch["sft_ids"][i, :n]
        with torch.no_grad():
            z = tr.model(input_ids=ids[None]).logits[0, :-1]  # position t predicts token t + 1
        by_t = {}
        for temp in (1.0, 0.7):
            logp = torch.log_softmax(z / temp, -1).gather(1, ids[1:, None])[:, 0]
            by_t[temp] = float(-(logp * w).sum() / w.sum())
        assert float(got[i]) == pytest.approx(by_t[1.0], rel=1e-4)
        assert abs(by_t[1.0] - by_t[0.7]) > 1e-2
        checked += 1
    assert checked == 2  # one SFT sequence per task


def test_notice_when_the_traces_carry_no_reasoning(tmp_path, tiny_model_dir, caplog):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    bare = {**EXPERT_TRACE, "turns": [{**t, "reasoning_segments": []} for t in EXPERT_TRACE["turns"]]}
    rows = make_rows(tok)
    samples = write_samples(tmp_path / "s", rows, {r["task_id"]: bare for r in rows})
    with caplog.at_level(logging.WARNING, logger="harnessrl.trainer.pact"):
        make_trainer(PactTrainer, tiny_model_dir, samples, algo="pact")
    notes = [r.getMessage() for r in caplog.records if "carry no reasoning" in r.getMessage()]
    assert len(notes) == 1 and "\n" not in notes[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="harnessrl.trainer.pact"):
        make_trainer(PactTrainer, tiny_model_dir, tiny_samples(tmp_path / "r", tiny_model_dir, traces=True), algo="pact")
    assert not [r for r in caplog.records if "carry no reasoning" in r.getMessage()]
