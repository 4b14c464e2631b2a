"""grpo / matpo objectives on the tiny model: equality with TRL's own loss, training lowers the
objective on a fixed batch, truncated IS, the CLI and its errors."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainer_fixtures import make_trainer, own_loss, start_logps, tiny_samples
from trl import GRPOTrainer

from harnessrl.trainer.grpo import HarnessTrainer
from harnessrl.trainer.matpo import MatpoTrainer


@pytest.fixture(scope="module")
def samples(tmp_path_factory, tiny_model_dir):
    return tiny_samples(tmp_path_factory.mktemp("grpo"), tiny_model_dir)


@pytest.mark.parametrize("agg,trl_type", [("token_mean", "bnpo"), ("seq_mean", "grpo")])
def test_grpo_loss_equals_trl_compute_loss(samples, tiny_model_dir, agg, trl_type):
    tr = make_trainer(HarnessTrainer, tiny_model_dir, samples, loss_agg=agg)
    batch = tr.fixed_batch()
    # A start-of-step policy different from the current one, so that ratios are clipped on both sides.
    old = start_logps(tr, batch) + 0.3 * torch.randn_like(batch["advantages"], generator=torch.Generator().manual_seed(0))
    ours = tr.objective(tr.model, {**batch, "old_per_token_logps": old})["loss"]
    ours.backward()
    g_ours = [p.grad.clone() for p in tr.model.parameters()]
    tr.model.zero_grad()
    tr.loss_type = trl_type
    trl_inputs = {k: batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")}
    trl_inputs.update(tool_mask=batch["loss_mask"], old_per_token_logps=old, num_items_in_batch=batch["loss_mask"].sum())
    theirs = GRPOTrainer._compute_loss(tr, tr.model, trl_inputs)
    theirs.backward()
    assert torch.allclose(ours, theirs, atol=1e-6), (float(ours), float(theirs))
    assert all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(g_ours, tr.model.parameters()))


@pytest.mark.parametrize("cls,kw", [(HarnessTrainer, {}), (HarnessTrainer, {"loss_agg": "rollout_mean", "beta": 0.01}), (MatpoTrainer, {"algo": "matpo"})])
def test_two_steps_lower_own_loss(samples, tiny_model_dir, cls, kw):
    tr = make_trainer(cls, tiny_model_dir, samples, **kw)
    batch = tr.fixed_batch()
    old = start_logps(tr, batch)
    before = own_loss(tr, batch, old)
    tr.train()
    assert tr.state.global_step == 2
    after = own_loss(tr, batch, old)
    assert after < before - 1e-4, (before, after)
    logged = tr.state.log_history[0]
    assert "entropy" in logged and "clip_ratio" in logged and "loss" in logged


def test_tis_weights_the_surrogate(samples, tiny_model_dir):
    # Behaviour log-probs are −2 on every generated token. At the start of the step (ratio 1) the
    # surrogate per token is −A·w with w = min(exp(logp_old + 2), cap): checked token by token.
    tr = make_trainer(HarnessTrainer, tiny_model_dir, samples, tis=True, tis_cap=2.0)
    batch = tr.fixed_batch()
    old = start_logps(tr, batch)
    per_token, _ = tr.per_token_loss(old.clone(), {**batch, "old_per_token_logps": old})
    w = torch.exp(old + 2.0).clamp(max=2.0)
    m = batch["loss_mask"] > 0
    assert torch.allclose(per_token[m], (-batch["advantages"] * w)[m], atol=1e-6)


def test_matpo_rejects_non_broadcast_advantages(tmp_path, tiny_model_dir):
    import pyarrow.parquet as pq

    from harnessrl.errors import UserError

    d = tiny_samples(tmp_path / "s", tiny_model_dir)
    t = pq.read_table(d / "samples.parquet").to_pylist()
    first = t[0]["loss_mask"].index(1)
    t[0]["advantage"][first] += 1.0  # one token of rollout r0 differs
    from trainer_fixtures import write_samples

    write_samples(d, t)
    with pytest.raises(UserError, match="--advantage matpo"):
        make_trainer(MatpoTrainer, tiny_model_dir, d, algo="matpo")


def _cli(*args, cwd=None):
    exe = str(Path(sys.executable).with_name("harnessrl"))
    return subprocess.run([exe, *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def test_cli_train_with_yaml_config_and_errors(samples, tiny_model_dir, tmp_path, monkeypatch, capsys):
    from harnessrl.app.cli import main

    cfg = tmp_path / "train.yaml"
    cfg.write_text(f"model: {tiny_model_dir}\nsteps: 1\nbatch_size: 4\nlr: 0.001\nloss_agg: seq_mean\n")
    r = _cli("train", str(samples), "--config", str(cfg), "--out", str(tmp_path / "ck"), "--weight-version", "v-test")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "ck" / "v-test" / "config.json").is_file() and (tmp_path / "ck" / "v-test" / "tokenizer.json").is_file()
    bad = [
        (("train", str(samples), "--model", str(tiny_model_dir), "--algo", "ppo"), "unknown --algo"),
        (("train", str(tmp_path / "nothing"), "--model", str(tiny_model_dir)), "no samples found"),
        (("train", str(samples), "--model", str(tmp_path)), "not a model directory"),
        (("train", str(samples), "--model", str(tiny_model_dir), "--algo", "capo"), "needs --partition"),
        (("train", str(samples), "--model", str(tiny_model_dir), "--loss-agg", "sum"), "unknown --loss-agg"),
        # CAPO's terms are per-class means: an aggregation it would ignore is refused, not dropped silently
        (("train", str(samples), "--model", str(tiny_model_dir), "--algo", "capo", "--partition", str(tmp_path / "p.pt"),
          "--loss-agg", "seq_mean"), "--loss-agg seq_mean does not apply to --algo capo"),
        (("train", str(samples), "--model", str(tiny_model_dir), "--algo", "capo", "--partition", str(tmp_path / "p.pt"),
          "--loss-agg", "token_mean"), "does not apply to --algo capo"),
        (("train", str(samples), "--model", str(tiny_model_dir), "--algo", "pact", "--pact-gate", "round"), "unknown pact_gate"),
        (("train", str(samples), "--model", str(tiny_model_dir), "--algo", "pact", "--pact-schedule-steps", "0"), "pact_schedule_steps"),
    ]
    for args, msg in bad:  # in-process through the same entry point, to keep the suite fast
        monkeypatch.setattr(sys, "argv", ["harnessrl", *args])
        with pytest.raises(SystemExit) as exc:
            main()
        err = capsys.readouterr().err
        assert exc.value.code == 2 and msg in err and "Traceback" not in err, (args, err[-500:])


def test_lora_trains_and_saves_adapter(samples, tiny_model_dir, tmp_path):
    from harnessrl.trainer.config import TrainConfig
    from harnessrl.trainer.push import save_checkpoint
    from harnessrl.trainer.run import build_trainer

    cfg = TrainConfig(samples=str(samples), model=str(tiny_model_dir), out=str(tmp_path), steps=2, batch_size=4, lr=1e-3,
                      lora=True, lora_r=4, lora_alpha=8, beta=0.01, report_to="none").validate()
    tr = build_trainer(cfg)
    base = {n: p.detach().clone() for n, p in tr.model.named_parameters() if "lora_" not in n}
    tr.train()
    assert tr.state.global_step == 2 and "kl" in tr.state.log_history[0]  # reference = the adapter switched off
    assert all(torch.equal(p, base[n]) for n, p in tr.model.named_parameters() if "lora_" not in n)  # base frozen
    path = save_checkpoint(tr, tmp_path, "lora-1")
    assert (path / "adapter_config.json").is_file() and (path / "adapter_model.safetensors").is_file()


def test_bf16_trains_on_a_machine_without_a_gpu(samples, tiny_model_dir, tmp_path):
    # transformers refused bf16 without a GPU ("Your setup doesn't support bf16/gpu") unless the run
    # is told it is on CPU; found measuring the real model's training speed (bench/real_model_speed.py)
    from harnessrl.trainer.config import TrainConfig
    from harnessrl.trainer.run import build_trainer

    cfg = TrainConfig(samples=str(samples), model=str(tiny_model_dir), out=str(tmp_path), steps=2, batch_size=4,
                      lr=1e-3, bf16=True, report_to="none").validate()
    tr = build_trainer(cfg)
    assert next(tr.model.parameters()).dtype == torch.bfloat16
    tr.train()
    assert tr.state.global_step == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in tr.state.log_history
                                             if "loss" in h)
