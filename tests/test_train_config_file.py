"""`--train-config` / `harnessrl train --config` YAML: number options read as numbers, whatever
YAML 1.1 makes of them, and a value that is no number named in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harnessrl.errors import UserError
from harnessrl.trainer.config import load_config


def test_numbers_yaml_reads_as_strings_are_numbers(tmp_path):
    # PyYAML reads 1.0e9 and 1e-5 (no sign in the exponent) as strings: the plain-ratio variant of
    # the async benchmark writes epsilon: 1.0e9, and it died in validate() with a TypeError
    path = tmp_path / "train.yaml"
    path.write_text("epsilon: 1.0e9\nlr: 1e-5\nsteps: '3'\ntis_cap: 2\n")
    cfg = load_config(path, {})
    assert (cfg.epsilon, cfg.lr, cfg.steps, cfg.tis_cap) == (1.0e9, 1e-5, 3, 2)
    assert isinstance(cfg.epsilon, float) and isinstance(cfg.steps, int)


@pytest.mark.parametrize("text, message", [("epsilon: lots\n", "config option epsilon: 'lots' is not a number"),
                                           ("steps: [1]\n", "config option steps: [1] is not an integer"),
                                           ("steps: 2.5\n", "config option steps: 2.5 is not an integer")])
def test_a_value_that_is_no_number_is_named(tmp_path, text, message):
    path = tmp_path / "train.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        load_config(path, {})
    assert str(err.value) == message


def test_the_loop_says_so_in_one_line(tmp_path, tiny_model_dir):
    (tmp_path / "train.yaml").write_text("epsilon: lots\n")
    done = subprocess.run([sys.executable, "-m", "harnessrl", "loop", "--harness", "lookup", "--model",
                           str(tiny_model_dir), "--out", str(tmp_path / "loop"), "--train-config",
                           str(tmp_path / "train.yaml")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "epsilon: 'lots' is not a number" in done.stderr
    assert "Traceback" not in done.stderr
