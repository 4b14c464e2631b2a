"""The asynchronous loop's behaviour correction (docs/methods.md §6.5) against numbers worked out by
hand, on the real trainer's per-token loss and loss shares, and the per-call weight versions a
real compile writes (`call_versions`, `trained_versions`)."""

import math

import pytest
import torch
from test_compiler_pipeline import Recorder, compile_
from trainer_fixtures import make_trainer, write_samples
from transformers import AutoTokenizer

from harnessrl.db import open_db
from harnessrl.errors import UserError
from harnessrl.records import Call
from harnessrl.samples import trained_versions
from harnessrl.trainer.config import TrainConfig
from harnessrl.trainer.diagnostics import Diagnostics
from harnessrl.trainer.grpo import HarnessTrainer
from harnessrl.trainer.losses import tis_weight

NAN = math.nan
# One sample, 3 generated tokens: tokens 1–2 sampled by weight version v1 (call c1), token 3 by v2
# after a push mid-session (call c2). The proximal policy (the weights at the step's start) gives
# logp_old; the server recorded logp_behaviour; the policy being trained gives logp_θ = logp_old + ln ρ.
OLD = [-1.0, -0.5, -2.0]
BEHAVIOUR = [-1.2, -1.5, -1.7]  # logp_old − logp_behaviour = 0.2, 1.0, −0.3
RHO = [1.5, 1.1, 0.5]  # ε = 0.2: clip range [0.8, 1.2]
A = 2.0


def one_sample(root, model_dir, behaviour):
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "Capital of France?"}], add_generation_prompt=True, tokenize=False)
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    gen = tok("The answer is Paris", add_special_tokens=False)["input_ids"][:3]
    assert len(gen) == 3
    n = len(prompt)
    row = dict(sample_id="r0/agent:solo/c2", rollout_id="r0", task_id="t0", group_id="t0", agent="solo", session_id=None,
               input_ids=prompt + gen, loss_mask=[0] * n + [1, 1, 1], token_class=[0] * n + [2, 2, 2],
               advantage=[0.0] * n + [A] * 3, behaviour_logprob=[None] * n + [None if math.isnan(b) else b for b in behaviour],
               turn_index=[-1] * n + [0, 0, 1], call_ids=["c1", "c2"], call_versions=["v1", "v2"], call_turns=[0, 1],
               prompt_len=n, weight_version="v2", outcome_reward=1.0, reward_breakdown="{}", retokenized=False)
    return write_samples(root, [row]), row


def loss_of(tr, rho=RHO, old=OLD):
    """(per-token loss, the step's loss under token_mean, logp_θ) for the chosen logp_old and ratios ρ."""
    batch = tr.fixed_batch()
    old_t = torch.tensor([old])
    logps = (old_t + torch.log(torch.tensor([rho]))).requires_grad_(True)
    per_token, _ = tr.per_token_loss(logps, {**batch, "old_per_token_logps": old_t})
    loss = tr.share(per_token, batch["loss_weights"])
    assert torch.allclose(batch["loss_weights"], torch.full((1, 3), 1 / 3))  # token_mean: 1/N, N = 3
    return per_token, loss, logps


def logged(tr) -> dict[str, float]:
    return {name: value for _, name, value in tr._diagnostics.flush()}


@pytest.mark.unit
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_two_versions_hand_numbers(tmp_path, tiny_model_dir, mode):
    # Clipped surrogate s = −min(ρA, clip(ρ, 0.8, 1.2)·A), A = 2:
    #   token 1: ρ = 1.5 → min(3.0, 2.4) = 2.4 (clipped)  → s = −2.4
    #   token 2: ρ = 1.1 → min(2.2, 2.2)                   → s = −2.2
    #   token 3: ρ = 0.5 → min(1.0, 1.6) = 1.0             → s = −1.0
    # Behaviour weight w = exp(logp_old − logp_behaviour), cap C = 2:
    #   token 1 (v1): e^0.2 = 1.221403;  token 2 (v1): e^1.0 = 2.718282 > C;  token 3 (v2): e^−0.3 = 0.740818
    #   truncate: w = [1.221403, 2, 0.740818];  mask: w = [1.221403, 0, 0.740818]
    # ℓ = w·s:  truncate [−2.931367, −4.4, −0.740818], mean over N = 3: −8.072185/3 = −2.690728
    #           mask     [−2.931367,  0,   −0.740818], mean over N = 3 (a masked token keeps its place
    #           in the count): −3.672185/3 = −1.224062
    d, row = one_sample(tmp_path / "s", tiny_model_dir, BEHAVIOUR)
    assert trained_versions(row) == {"v1", "v2"}
    tr = make_trainer(HarnessTrainer, tiny_model_dir, d, tis=True, tis_cap=2.0, tis_mode=mode)
    per_token, loss, logps = loss_of(tr)
    e02, e03 = math.exp(0.2), math.exp(-0.3)
    w = [e02, 2.0, e03] if mode == "truncate" else [e02, 0.0, e03]
    expected = [-2.4 * w[0], -2.2 * w[1], -1.0 * w[2]]
    assert per_token[0].tolist() == pytest.approx(expected, rel=1e-5)
    assert float(loss.detach()) == pytest.approx({"truncate": -2.690728, "mask": -1.224062}[mode], rel=1e-5)
    # gradient ∂loss/∂logp_θ = −w·ρ·A/3 where the clip does not hold the token; 0 on token 1 (clipped)
    # and, in mask mode, on token 2 (masked): truncate [0, −2·1.1·2/3, −0.740818·0.5·2/3]
    loss.backward()
    assert logps.grad[0].tolist() == pytest.approx([0.0, -w[1] * 1.1 * A / 3, -w[2] * 0.5 * A / 3], abs=1e-6)
    # diagnostics: all 3 tokens have a behaviour log-prob; mean |gap| = (0.2 + 1.0 + 0.3)/3 = 0.5;
    # largest raw weight e^1 = 2.718282; 1 of 3 above C; mean applied weight = Σw/3
    got = logged(tr)
    assert got["behaviour/unknown_frac"] == 0.0
    assert got["behaviour/abs_gap"] == pytest.approx(0.5, rel=1e-5)
    assert got["behaviour/raw_weight_max"] == pytest.approx(math.e, rel=1e-5)
    assert got["behaviour/capped_frac"] == pytest.approx(1 / 3)
    assert got["behaviour/weight_mean"] == pytest.approx(sum(w) / 3, rel=1e-5)  # truncate 1.320740, mask 0.654074


@pytest.mark.unit
def test_unknown_behaviour_logprob_weighs_one_and_is_counted(tmp_path, tiny_model_dir):
    # Token 2 has no recorded log-prob (NaN): w = 1, the proximal policy standing in for the behaviour.
    # ℓ = [−2.4·e^0.2, −2.2·1, −1.0·e^−0.3] = [−2.931367, −2.2, −0.740818]; mean −5.872185/3 = −1.957395.
    # Logged: unknown 1 of 3; over the 2 known tokens mean |gap| = (0.2 + 0.3)/2 = 0.25, max weight e^0.2.
    d, _ = one_sample(tmp_path / "s", tiny_model_dir, [-1.2, NAN, -1.7])
    tr = make_trainer(HarnessTrainer, tiny_model_dir, d, tis=True, tis_cap=2.0)
    per_token, loss, _ = loss_of(tr)
    assert per_token[0].tolist() == pytest.approx([-2.4 * math.exp(0.2), -2.2, -math.exp(-0.3)], rel=1e-5)
    assert float(loss.detach()) == pytest.approx(-1.957395, rel=1e-5)
    got = logged(tr)
    assert got["behaviour/unknown_frac"] == pytest.approx(1 / 3)
    assert got["behaviour/abs_gap"] == pytest.approx(0.25, rel=1e-5)
    assert got["behaviour/raw_weight_max"] == pytest.approx(math.exp(0.2), rel=1e-5)
    assert got["behaviour/capped_frac"] == 0.0
    # tis off: no weight, the gap is still logged (how far the behaviour policy is, correction or not)
    plain = make_trainer(HarnessTrainer, tiny_model_dir, d)
    per_token, _, _ = loss_of(plain)
    assert per_token[0].tolist() == pytest.approx([-2.4, -2.2, -1.0], rel=1e-6)
    got = logged(plain)
    assert got["behaviour/unknown_frac"] == pytest.approx(1 / 3) and "behaviour/weight_mean" not in got


@pytest.mark.unit
def test_correction_off_is_the_plain_unclipped_ratio_to_behaviour(tmp_path, tiny_model_dir):
    # {ratio_to: behaviour, tis: false, epsilon: 1e9}: logp_old = logp_behaviour, ρ = π_θ/π_behaviour,
    # clip range [1 − 1e9, 1 + 1e9] never reached, so ℓ = −min(ρA, ρA) = −ρA. With ρ = [1.5, 3.0, 0.25]
    # (logp_θ = logp_behaviour + ln ρ), A = 2: ℓ = [−3.0, −6.0, −0.5], mean −9.5/3 = −3.166667, and every
    # token carries gradient −ρA/3 = [−1.0, −2.0, −0.166667]. At ε = 0.2 the clip would hold tokens 1–2:
    # ℓ = [−2.4, −2.4, −0.5], mean −1.766667.
    d, _ = one_sample(tmp_path / "s", tiny_model_dir, BEHAVIOUR)
    rho = [1.5, 3.0, 0.25]
    off = make_trainer(HarnessTrainer, tiny_model_dir, d, ratio_to="behaviour", tis=False, epsilon=1.0e9)
    per_token, loss, logps = loss_of(off, rho=rho, old=BEHAVIOUR)
    assert per_token[0].tolist() == pytest.approx([-3.0, -6.0, -0.5], rel=1e-5)
    assert float(loss.detach()) == pytest.approx(-9.5 / 3, rel=1e-5)
    loss.backward()
    assert logps.grad[0].tolist() == pytest.approx([-1.0, -2.0, -0.5 / 3], rel=1e-5)
    clipped = make_trainer(HarnessTrainer, tiny_model_dir, d, ratio_to="behaviour", tis=False)
    _, loss, _ = loss_of(clipped, rho=rho, old=BEHAVIOUR)
    assert float(loss.detach()) == pytest.approx(-5.3 / 3, rel=1e-5)


@pytest.mark.unit
def test_tis_weight_modes_and_config_errors():
    # old − behaviour = [ln 3, ln 1.5, −ln 2, unknown], C = 2: truncate [2, 1.5, 0.5, 1]; mask [0, 1.5, 0.5, 1]
    old = torch.zeros(4)
    b = torch.tensor([-math.log(3), -math.log(1.5), math.log(2), NAN])
    assert tis_weight(old, b, 2.0, "truncate").tolist() == pytest.approx([2.0, 1.5, 0.5, 1.0])
    assert tis_weight(old, b, 2.0, "mask").tolist() == pytest.approx([0.0, 1.5, 0.5, 1.0])
    with pytest.raises(UserError, match="tis_mode"):
        TrainConfig(tis_mode="clip").validate()
    with pytest.raises(UserError, match="tis_cap"):
        TrainConfig(tis_cap=0.5).validate()


@pytest.mark.unit
def test_diagnostic_maximum_over_micro_batches_and_processes():
    # process 0 saw 1.5 then 2.5, process 1 saw 4.0: the maximum is 4.0 whatever the split; the token
    # mean beside it stays a ratio of sums: (3 + 1)/(2 + 2) = 1.0
    p0, p1 = Diagnostics(), Diagnostics()
    p0.add_max("train", "w_max", 1.5)
    p0.add_max("train", "w_max", 2.5)
    p0.add("train", "gap", 3.0, 2.0)
    p1.add_max("train", "w_max", 4.0)
    p1.add("train", "gap", 1.0, 2.0)
    theirs = [(m, n, num, den) for (m, n), (num, den) in p1.sums.items()] + [(m, n, v, None) for (m, n), v in p1.maxima.items()]
    assert p0.flush(lambda mine: mine + theirs) == [("train", "gap", 1.0), ("train", "w_max", 4.0)]
    assert p0.flush() == []  # flushed: the next log starts afresh


def test_compile_keeps_each_calls_weight_version(tmp_path, tiny_model_dir):
    # One session, served across pushes: a0 (v1); a1 extends it (v2); a2 retries a1's turn (v3), so its
    # path [a0, a2] trains only a2's tokens; then the harness compresses its history: c0 starts a new
    # root at turn 2 (v3), c1 extends it (v4). Each sample carries the version of every call on its path,
    # and trained_versions the versions of the calls whose tokens it trains.
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    db = str(tmp_path / "runs.db")
    rec = Recorder(db, tok)
    rec.rollout("r1", "t1", None, reward=1.0)
    m0 = [{"role": "system", "content": "Solve."}, {"role": "user", "content": "Long task?"}]
    a0 = rec.call("a0", "r1", "solo", rec.render(m0), "Step one.", m0)
    rec.call("a1", "r1", "solo", rec.extend(a0[0], a0[1], "one"), "Step two.", m0)
    rec.call("a2", "r1", "solo", rec.extend(a0[0], a0[1], "one"), "Step two, again.", m0)
    m2 = [{"role": "system", "content": "Solve."}, {"role": "user", "content": "Summary: step one done."}]
    c0 = rec.call("c0", "r1", "solo", rec.render(m2), "Step three.", m2)
    rec.call("c1", "r1", "solo", rec.extend(c0[0], c0[1], "three"), "Done.", m2)
    versions = {"a0": "v1", "a1": "v2", "a2": "v3", "c0": "v3", "c1": "v4"}
    _, make = open_db(db)
    with make.begin() as s:
        for cid, v in versions.items():
            s.get(Call, cid).weight_version = v
    _, samples = compile_(db, tmp_path, tiny_model_dir)
    assert sorted(samples) == ["r1/agent:solo/a1", "r1/agent:solo/a2", "r1/agent:solo/c1"]
    a1, a2, c1 = samples["r1/agent:solo/a1"], samples["r1/agent:solo/a2"], samples["r1/agent:solo/c1"]
    assert (a1["call_ids"], a1["call_versions"], a1["call_turns"]) == (["a0", "a1"], ["v1", "v2"], [0, 1])
    assert (a2["call_ids"], a2["call_versions"], a2["call_turns"]) == (["a0", "a2"], ["v1", "v3"], [0, 1])
    # the compressed context's path starts at turn 2: turn_index is not a position in call_ids
    assert (c1["call_ids"], c1["call_versions"], c1["call_turns"]) == (["c0", "c1"], ["v3", "v4"], [2, 3])
    assert {t for t, m in zip(c1["turn_index"], c1["loss_mask"]) if m} == {2, 3}
    assert trained_versions(a1) == {"v1", "v2"}
    assert trained_versions(a2) == {"v3"}  # a0's tokens are trained in a1's path only
    assert trained_versions(c1) == {"v3", "v4"}
    assert (a1["weight_version"], a2["weight_version"], c1["weight_version"]) == ("v2", "v3", "v4")


@pytest.mark.unit
def test_training_reads_its_columns_only(tmp_path, tiny_model_dir):
    # A compile output from before call_versions / call_turns existed still trains; a file that lacks
    # a column training reads, or is not Parquet, is a one-line error.
    import pyarrow.parquet as pq

    from harnessrl.samples import SAMPLE_SCHEMA
    from harnessrl.trainer.data import TRAINED_COLUMNS, load_samples

    assert set(TRAINED_COLUMNS) <= set(SAMPLE_SCHEMA.names)
    d, _ = one_sample(tmp_path / "s", tiny_model_dir, BEHAVIOUR)
    path = d / "samples.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["call_versions", "call_turns"]), path)
    s = load_samples(d).samples[0]
    assert s.behaviour_logprob[-3:] == pytest.approx(BEHAVIOUR) and s.advantage[-3:] == [A] * 3
    pq.write_table(pq.read_table(path).drop_columns(["behaviour_logprob"]), path)
    with pytest.raises(UserError, match="missing columns: behaviour_logprob"):
        load_samples(d)
    path.write_text("not parquet")
    with pytest.raises(UserError, match="cannot read"):
        load_samples(d)
