"""`harnessrl loop --algo capo` without `--partition` makes the partition from round 0's samples
(`loop._capo_partition`) with `build_partition`'s own defaults."""

import pytest
from trainer_fixtures import tiny_samples
from transformers import AutoModelForCausalLM

from harnessrl.app.loop import _capo_partition
from harnessrl.trainer.capo_partition import Partition

pytestmark = pytest.mark.unit


def test_the_loop_makes_the_capo_partition_at_the_default_rho(tmp_path, tiny_model_dir):
    samples = tiny_samples(tmp_path / "samples", tiny_model_dir)
    part = Partition.load(_capo_partition(samples, str(tiny_model_dir), tmp_path / "partition.pt"))
    # the tokenizer's pad id (0 for the tiny model) once went in as rho: "rho must be in (0, 1]"
    units = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.intermediate_size
    assert part.meta["rho"] == 0.25 and (part.act.sum(1) == round(0.25 * units)).all()
