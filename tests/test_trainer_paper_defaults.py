"""The papers' objectives as the defaults of `--algo matpo` and `--algo pact` (docs/methods.md §6.3,
§6.4), checked against numbers worked out by hand; the earlier behaviours stay as named options."""

import pytest
import torch
from trainer_fixtures import EXPERT_TRACE, make_rows, make_trainer, write_samples
from transformers import AutoTokenizer

from harnessrl.trainer.config import TrainConfig
from harnessrl.trainer.matpo import MatpoTrainer
from harnessrl.trainer.normalise import row_weights
from harnessrl.trainer.pact import PactTrainer, gate

# make_rows' groups of two with outcomes (1, 0): A = ±0.5 / (std(1, 0) + 1e-6) = ±0.5 / 0.7071078
A = 0.5 / (0.5 ** 0.5 + 1e-6)


def trimmed(rows: list[dict], keep: list[int]) -> list[dict]:
    """Row i keeps only its first keep[i] trainable tokens (uneven counts make the means differ)."""
    for r, k in zip(rows, keep):
        kept, mask = 0, []
        for m in r["loss_mask"]:
            kept += m
            mask.append(m if kept <= k else 0)
        r["loss_mask"] = mask
        r["behaviour_logprob"] = [(-2.0 if m else None) for m in mask]
    return rows


def start_loss(tr, batch) -> float:
    """The objective at the start of the step (ratio 1: the surrogate per token is −A)."""
    with torch.no_grad():
        return float(tr.objective(tr.model, batch)["loss"])


@pytest.mark.unit
def test_defaults_come_from_the_algorithm():
    assert [TrainConfig(algo=a, partition="p.pt").validate().aggregation() for a in ("grpo", "capo", "matpo", "pact")] == \
        ["token_mean", "token_mean", "rollout_mean", "prompt_mean"]
    assert TrainConfig(algo="matpo", loss_agg="token_mean").validate().aggregation() == "token_mean"  # allowed again
    cfg = TrainConfig(algo="pact").validate()
    assert cfg.pact_gate == "epoch" and cfg.pact_level_limits_context is True


@pytest.mark.unit
def test_prompt_mean_weights_by_hand():
    # rows (prompt, trainable tokens): t0 3 and 5; t1 7 and 9. P = 2, n_t0 = 8, n_t1 = 16:
    # w = 1/16 on t0's tokens, 1/32 on t1's; a prompt split over processes counts once.
    rows = [("t0", 3.0), ("t0", 5.0), ("t1", 7.0), ("t1", 9.0)]
    assert row_weights(rows, rows, "prompt_mean") == pytest.approx([1 / 16, 1 / 16, 1 / 32, 1 / 32])
    assert row_weights(rows[2:], rows, "prompt_mean") == pytest.approx([1 / 32, 1 / 32])


@pytest.fixture(scope="module")
def matpo_samples(tmp_path_factory, tiny_model_dir):
    # Two rollouts, each a planner and a worker sample: r0 (A = +1.5) with 3 + 5 trainable tokens,
    # r1 (A = −0.5) with 4 + 2.
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = trimmed(make_rows(tok, n_tasks=1, k=4), [3, 5, 4, 2])
    for i, r in enumerate(rows):
        a = 1.5 if i < 2 else -0.5
        r.update(rollout_id=f"r{i // 2}", agent="planner" if i % 2 == 0 else "worker", sample_id=f"r{i // 2}/{i}",
                 advantage=[a * m for m in r["loss_mask"]])
    return write_samples(tmp_path_factory.mktemp("matpo-defaults"), rows)


def test_matpo_default_is_the_per_rollout_mean(matpo_samples, tiny_model_dir):
    # Paper: (1/G) Σ_i (1/Σ_t|τ_i^t|) Σ_t R^clip: each rollout's tokens (planner and workers) averaged,
    # then the rollouts: −(1.5 + (−0.5))/2 = −0.5. The token mean over the augmented batch (the
    # earlier default, now `--loss-agg token_mean`): −(8·1.5 − 6·0.5)/14 = −9/14 = −0.642857.
    tr = make_trainer(MatpoTrainer, tiny_model_dir, matpo_samples, algo="matpo", batch_size=4)
    assert start_loss(tr, tr.fixed_batch()) == pytest.approx(-0.5, abs=1e-6)
    # any split: a rollout's planner and worker in different micro-batches still count once
    parts = tr.micro_batches([[tr.data.samples[0], tr.data.samples[2]], [tr.data.samples[1], tr.data.samples[3]]])
    assert sum(start_loss(tr, p) for p in parts) == pytest.approx(-0.5, abs=1e-6)
    tm = make_trainer(MatpoTrainer, tiny_model_dir, matpo_samples, algo="matpo", batch_size=4, loss_agg="token_mean")
    assert start_loss(tm, tm.fixed_batch()) == pytest.approx(-9 / 14, abs=1e-6)


@pytest.fixture(scope="module")
def pact_samples(tmp_path_factory, tiny_model_dir):
    # Two prompts (tasks) of two rollouts, A = +a, −a in each; trainable tokens t0: 3, 5; t1: 7, 9.
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = trimmed(make_rows(tok, n_tasks=2, k=2), [3, 5, 7, 9])
    return write_samples(tmp_path_factory.mktemp("pact-defaults"), rows, {"t0": EXPERT_TRACE, "t1": EXPERT_TRACE})


def test_pact_default_is_the_per_prompt_loss(pact_samples, tiny_model_dir):
    # L = (1/P) Σ_i L_i. Anchors only (q = 1): L_i = L^x_RL(i), the token mean over prompt i's rows:
    # t0: −a(3 − 5)/8 = a/4, t1: −a(7 − 9)/16 = a/8 → L = (a/4 + a/8)/2 = 3a/16 = 0.132582.
    # The earlier step-wide token mean: −a(3 − 5 + 7 − 9)/24 = a/6 = 0.117851.
    tr = make_trainer(PactTrainer, tiny_model_dir, pact_samples, algo="pact", pact_q=1.0, beta=0.0, batch_size=4)
    assert start_loss(tr, tr.fixed_batch()) == pytest.approx(3 * A / 16, abs=1e-6)
    assert 3 * A / 16 == pytest.approx(0.132582, abs=1e-6)
    tm = make_trainer(PactTrainer, tiny_model_dir, pact_samples, algo="pact", pact_q=1.0, beta=0.0, batch_size=4, loss_agg="token_mean")
    assert start_loss(tm, tm.fixed_batch()) == pytest.approx(A / 6, abs=1e-6)
    # Traces only (q = 0): L_i = L^h_RL(i) + 0.1·L_SFT(i); at ratio 1 L^h_RL(i) has the same value as
    # L^x_RL(i), so L = 3a/16 + 0.1·(L_SFT(t0) + L_SFT(t1))/2, whatever the split.
    tz = make_trainer(PactTrainer, tiny_model_dir, pact_samples, algo="pact", pact_q=0.0, beta=0.0, batch_size=4)
    batch = tz.fixed_batch()
    with torch.no_grad():
        sft = tz.sft_losses(tz.model, batch)
    assert int((sft != 0).sum()) == 2 and float(sft.sum()) > 0
    expect = 3 * A / 16 + 0.1 * float(sft.sum()) / 2
    assert start_loss(tz, batch) == pytest.approx(expect, abs=1e-5)
    s = tz.data.samples
    parts = tz.micro_batches([[s[0], s[3]], [s[1]], [s[2]]])  # each prompt split over micro-batches
    assert sum(start_loss(tz, p) for p in parts) == pytest.approx(expect, abs=1e-5)


@pytest.mark.unit
def test_gate_draws_by_hand():
    # sha256("1:t0:0") etc.: the first 8 bytes as a fraction u, z = [u < q]. These fixed values make
    # the test below discriminate: at seed 1 and q = 0.5 both gates change between draws 0 and 1.
    assert [gate(1, "t0", d, 0.5) for d in range(3)] == [1, 0, 0]
    assert [gate(1, "t1", d, 0.5) for d in range(3)] == [0, 1, 0]


def test_pact_gate_is_per_prompt_for_the_epoch(pact_samples, tiny_model_dir):
    # 4 samples, 2 a step: an epoch is 2 steps. Default: steps 0 and 1 use draw 0 (t0 anchor, t1 trace),
    # step 2 draw 1; `pact_gate: step` redraws at step 1.
    tr = make_trainer(PactTrainer, tiny_model_dir, pact_samples, algo="pact", pact_q=0.5, batch_size=2, steps=3, seed=1)
    assert tr.plan.per_epoch == 2

    def gates(trainer, step):
        trainer.state.global_step = step
        return {s.task_id: float(g) for s, g in zip(trainer.data.samples, trainer.build_batch(trainer.data.samples)["gate"])}

    assert [gates(tr, step) for step in (0, 1, 2)] == [{"t0": 1.0, "t1": 0.0}, {"t0": 1.0, "t1": 0.0}, {"t0": 0.0, "t1": 1.0}]
    ts = make_trainer(PactTrainer, tiny_model_dir, pact_samples, algo="pact", pact_q=0.5, batch_size=2, steps=3, seed=1,
                      pact_gate="step")
    assert [gates(ts, step) for step in (0, 1, 2)] == [{"t0": 1.0, "t1": 0.0}, {"t0": 0.0, "t1": 1.0}, {"t0": 0.0, "t1": 0.0}]


def test_pact_level_limits_the_privileged_context(pact_samples, tiny_model_dir):
    # S = 2 steps: level(1) = 4 − ⌊5·1/2⌋ = 2, which reveals ⌈2/4 · 2⌉ = 1 of the 2 safe segments, in the
    # SFT targets and (by default) in the privileged block; with the option off the block shows both.
    def block_text(**kw):
        tr = make_trainer(PactTrainer, tiny_model_dir, pact_samples, algo="pact", pact_q=0.0, batch_size=4, **kw)
        tr.state.global_step = 1
        assert tr.schedule()[1] == 2
        batch = tr.build_batch(tr.data.samples)
        return tr.tok.decode(batch["prompt_ids"][0][batch["prompt_mask"][0] > 0])

    limited, full = block_text(), block_text(pact_level_limits_context=False)
    assert "Reasoning: The question asks for a capital." in limited and "lookup tool" not in limited
    assert "The question asks for a capital.\n\nI will look it up with the lookup tool." in full


def test_pact_schedules_anneal_over_the_whole_training(pact_samples, tiny_model_dir, tmp_path):
    # A run that starts at step 3 of a 10-step training, at its own step 1: s = 4, S = 10 →
    # λ_a = 0.8 − 0.6·min(4/10, 1) = 0.56 and level = 4 − min(4, ⌊5·4/10⌋) = 2 (its own s = 1, S = 2
    # would give λ_a 0.5, level 2; s = 1 of S = 10: 0.74, level 4).
    tr = make_trainer(PactTrainer, tiny_model_dir, pact_samples, algo="pact", batch_size=4,
                      pact_schedule_start=3, pact_schedule_steps=10)
    tr.state.global_step = 1
    lam, level = tr.schedule()
    assert lam == pytest.approx(0.56) and level == 2
    # `loop` places round r of R rounds of n steps at r·n of R·n: round 1 of 3 with 2 steps each
    from harnessrl.app.loop.config import LoopConfig
    from harnessrl.app.loop.config import LoopConfig
    from harnessrl.app.loop.stages import train_config

    cfg = train_config(LoopConfig(harness="toolbox", algo="pact", rounds=3, steps=2), tmp_path, str(tiny_model_dir),
                       tmp_path, 1 * 2, 2, 8, None, str(tiny_model_dir))
    assert (cfg.pact_schedule_start, cfg.pact_schedule_steps) == (2, 6)
    assert cfg.ref_model == str(tiny_model_dir)  # the KL reference: the loop's initial model, every round
