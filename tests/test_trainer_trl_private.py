"""The private TRL members the trainer relies on (trainer/trl_private.py) against the installed TRL,
and the declared TRL range against the tested one."""

import re
import tomllib
from pathlib import Path

import pytest
import torch
from packaging.specifiers import SpecifierSet
from trainer_fixtures import make_trainer, tiny_samples
from trl import GRPOTrainer

from harnessrl.trainer import trl_private
from harnessrl.trainer.grpo import HarnessTrainer

pytestmark = pytest.mark.unit


def test_declared_range_is_the_tested_one():
    deps = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    trl_req = next(d for d in deps if re.match(r"trl\b", d))
    assert SpecifierSet(trl_req[3:]) == SpecifierSet(trl_private.TESTED), trl_req
    assert trl_private.trl_version() in SpecifierSet(trl_private.TESTED), (
        f"installed trl {trl_private.trl_version()} is outside the tested range trl{trl_private.TESTED}")


def test_private_members_match_installed_trl(tmp_path, tiny_model_dir):
    assert trl_private.drift() == [], f"trl {trl_private.trl_version()} changed: {trl_private.drift()}"
    tr = make_trainer(HarnessTrainer, tiny_model_dir, tiny_samples(tmp_path, tiny_model_dir))
    problems = trl_private.drift(tr)
    assert problems == [], f"trl {trl_private.trl_version()} changed: {problems}"
    # The three-value return (logps, entropies, aux_loss) of TRL ≥ 1.7, called for real.
    batch = tr.fixed_batch([0, 1])
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    out = GRPOTrainer._get_per_token_logps_and_entropies(tr, tr.model, ids, attn, batch["completion_ids"].size(1), compute_entropy=True)
    assert isinstance(out, tuple) and len(out) == 3, (
        f"trl {trl_private.trl_version()}: GRPOTrainer._get_per_token_logps_and_entropies returned {len(out)} values, expected 3")
    logps, entropy = trl_private.per_token_logps(tr, tr.model, ids, attn, batch["completion_ids"].size(1), compute_entropy=True)
    assert logps.shape == entropy.shape == batch["completion_ids"].shape


def test_scoring_only_kept_positions_changes_no_value(tmp_path, tiny_model_dir):
    """`per_token_logps` scores only the completion positions on CPU (TRL's Triton-device path);
    log-probs, entropies and gradients equal TRL's every-position path on the same rows."""
    tr = make_trainer(HarnessTrainer, tiny_model_dir, tiny_samples(tmp_path, tiny_model_dir))
    batch = tr.fixed_batch()
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    keep = batch["completion_ids"].size(1)
    assert batch["prompt_mask"].sum() > 0  # prompt positions to skip
    params = [p for p in tr.model.parameters() if p.requires_grad]

    def run(fn):
        tr.model.zero_grad(set_to_none=True)
        logps, entropy = fn()
        (logps * batch["completion_mask"]).sum().backward()
        return logps.detach(), entropy.detach(), [p.grad.clone() for p in params]

    every = run(lambda: GRPOTrainer._get_per_token_logps_and_entropies(tr, tr.model, ids, attn, keep,
                                                                       compute_entropy=True)[:2])
    kept = run(lambda: trl_private.per_token_logps(tr, tr.model, ids, attn, keep, compute_entropy=True))
    m = batch["completion_mask"].bool()
    torch.testing.assert_close(kept[0][m], every[0][m])
    torch.testing.assert_close(kept[1][m], every[1][m])
    assert bool((kept[0][~m] == 0).all())
    for a, b in zip(kept[2], every[2]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_drift_names_member_and_version():
    class OlderTrl(GRPOTrainer):  # a TRL whose _compute_loss lost `inputs` and whose flag flipped
        loss_is_scaled_for_ga = False

        def _compute_loss(self, model):
            return None

    problems = trl_private.drift(base=OlderTrl)
    v = trl_private.trl_version()
    assert f"trl {v}: GRPOTrainer._compute_loss has no parameter(s) inputs" in problems
    assert f"trl {v}: GRPOTrainer.loss_is_scaled_for_ga is False, expected True" in problems

    class TwoValues:  # TRL < 1.7 returned (logps, entropies)
        def _get_per_token_logps_and_entropies(self, *a, **k):
            return torch.zeros(1), None

    with pytest.raises(RuntimeError, match=rf"trl {re.escape(v)}: GRPOTrainer._get_per_token_logps_and_entropies returned tuple of 2"):
        trl_private.per_token_logps(TwoValues(), None, None, None, 1)
