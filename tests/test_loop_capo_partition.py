"""`harnessrl loop --algo capo` passes one partition file to every round's trainer; the trainer makes
it at the first round with a successful rollout, at the default ρ, and reuses it after: a round
without a success before it trains unrouted instead of aborting the loop (docs/methods.md §6.2)."""

import pytest
from trainer_fixtures import make_trainer, tiny_samples
from transformers import AutoModelForCausalLM

from harnessrl.trainer.capo import CapoTrainer
from harnessrl.trainer.capo_partition import Partition

pytestmark = pytest.mark.unit


def test_rounds_share_one_partition_made_at_the_first_success(tmp_path, tiny_model_dir):
    path = tmp_path / "capo_partition.pt"
    failed = tiny_samples(tmp_path / "round0", tiny_model_dir, rewards=[0.0] * 4)
    round0 = make_trainer(CapoTrainer, tiny_model_dir, failed, algo="capo", partition=str(path))
    assert round0.partition is None and not path.exists()  # unrouted, no abort ("no successful rollout" once ended the loop)
    round1 = make_trainer(CapoTrainer, tiny_model_dir, tiny_samples(tmp_path / "round1", tiny_model_dir), algo="capo",
                          partition=str(path))
    part = Partition.load(path)
    # the tokenizer's pad id (0 for the tiny model) once went in as rho: "rho must be in (0, 1]"
    units = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.intermediate_size
    assert part.meta["rho"] == 0.25 and (part.act.sum(1) == round(0.25 * units)).all()
    assert round1.partition.meta == part.meta
    stamp = path.stat().st_mtime_ns
    round2 = make_trainer(CapoTrainer, tiny_model_dir, failed, algo="capo", partition=str(path))
    assert round2.partition is not None and round2.routes and path.stat().st_mtime_ns == stamp  # reused, not rebuilt
