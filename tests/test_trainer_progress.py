"""What a training run prints (trainer/progress.py): one bar of optimizer steps with the last step's
key figures, not transformers' metric dictionary a step; every step's metrics kept in full beside
the checkpoint."""

from __future__ import annotations

import json

import pytest
from trainer_fixtures import tiny_samples

from harnessrl.trainer.config import TrainConfig
from harnessrl.trainer.progress import figures
from harnessrl.trainer.run import train


@pytest.mark.unit
def test_the_figures_are_the_few_keys_a_person_reads():
    logs = {"loss": -0.01234, "grad_norm": 0.5, "clip_ratio": 0.125, "learning_rate": 1e-6, "entropy": 1.5,
            "num_tokens": 900.0, "kl": None}
    assert figures(logs, 2.25) == "loss -0.0123  grad 0.5  clip 0.12  entropy 1.50  2.2 s/step"
    assert figures({}, None) == ""


def test_a_run_prints_one_bar_and_keeps_every_step(tmp_path, tiny_model_dir, capsys):
    samples = tiny_samples(tmp_path / "s", tiny_model_dir)
    cfg = TrainConfig(samples=str(samples), model=str(tiny_model_dir), out=str(tmp_path / "ck"), steps=3,
                      batch_size=4, lr=1e-4, report_to="none").validate()
    result = train(cfg)
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert "training" in text and "3/3" in text and "s/step" in text and "loss " in text
    assert "{'loss'" not in text and "'grad_norm'" not in text  # transformers' per-step dictionaries
    kept = json.loads((result.checkpoint / "train_log.json").read_text())
    steps = [e for e in kept if "loss" in e]
    assert [e["step"] for e in steps] == [1, 2, 3] and all("grad_norm" in e for e in steps)
    assert kept == result.log_history
