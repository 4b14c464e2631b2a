"""Adam's state carried across training runs (trainer/optimizer_state.py): two runs of one step,
the second given the first checkpoint's optimizer.pt, end on the same weights as one run of two
steps; without it they do not (the second run restarts Adam)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trainer_fixtures import tiny_samples

from harnessrl.errors import UserError
from harnessrl.trainer.config import TrainConfig
from harnessrl.trainer.optimizer_state import FILE
from harnessrl.trainer.run import train


def _train(samples: Path, model: str, out: Path, steps: int, **kw) -> Path:
    # ratio_to step: logp_old is the current policy in both paths, so a step's gradient depends only
    # on the weights it starts from and the (whole, fixed) batch: the optimizer alone can differ
    cfg = TrainConfig(samples=str(samples), model=model, out=str(out), steps=steps, batch_size=4, lr=1e-3,
                      ratio_to="step", report_to="none", **kw).validate()
    return train(cfg).checkpoint


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(checkpoint / "model.safetensors")


def test_two_runs_with_the_state_carried_are_one_run(tmp_path, tiny_model_dir):
    samples = tiny_samples(tmp_path / "s", tiny_model_dir)
    whole = _weights(_train(samples, str(tiny_model_dir), tmp_path / "whole", 2))
    first = _train(samples, str(tiny_model_dir), tmp_path / "first", 1)
    state = torch.load(first / FILE, weights_only=True)
    assert {s["step"].item() for s in state["state"].values()} == {1.0}
    carried = _train(samples, str(first), tmp_path / "carried", 1, optimizer_state=str(first / FILE))
    fresh = _train(samples, str(first), tmp_path / "fresh", 1)
    assert torch.load(carried / FILE, weights_only=True)["state"][0]["step"].item() == 2.0
    # equal up to float noise (Adam divides by √v, which is tiny for a rarely trained embedding row):
    # under 1 % of one step's lr
    gap = max((whole[name] - w).abs().max().item() for name, w in _weights(carried).items())
    assert gap < 1e-5, gap
    # restarting Adam moves a parameter by about lr at its first step (m/√v = ±1): far from one run
    apart = max((whole[name] - w).abs().max().item() for name, w in _weights(fresh).items())
    assert apart > 1e-4 > 10 * gap, (apart, gap)


def test_a_missing_or_foreign_state_is_named(tmp_path, tiny_model_dir):
    samples = tiny_samples(tmp_path / "s", tiny_model_dir)
    with pytest.raises(UserError, match="no such file"):
        _train(samples, str(tiny_model_dir), tmp_path / "a", 1, optimizer_state=str(tmp_path / "none.pt"))
    foreign = tmp_path / "foreign.pt"
    torch.save(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))]).state_dict(), foreign)
    with pytest.raises(UserError, match="not this model's optimizer"):
        _train(samples, str(tiny_model_dir), tmp_path / "b", 1, optimizer_state=str(foreign))
