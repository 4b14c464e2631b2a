"""The private TRL members the trainer relies on (trainer/trl_private.py) against the installed TRL,
and the declared TRL range against the tested one."""

import contextlib
import re
import types
import tomllib
from pathlib import Path

import pytest
import torch
from packaging.specifiers import SpecifierSet
from trainer_fixtures import make_rows, make_trainer, prepend_prompt, tiny_samples, write_samples
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
    # The fused head, called for real: per-position log-probs and entropies.
    batch = tr.fixed_batch([0, 1])
    p = batch["packed"]
    logps, entropy = trl_private.fused_logps(tr, tr.model, True, input_ids=p.input_ids, position_ids=p.position_ids,
                                             labels=p.labels, packed_bounds=p.bounds)
    assert logps.shape == entropy.shape == (1, p.tokens - 1)
    assert trl_private.step_counter(tr) == 0


def test_packed_log_probs_equal_trl_padded_ones(tmp_path, tiny_model_dir):
    """The packed forward (trainer/packing.py: no padding, attention per sequence, only completion
    positions scored) gives TRL's own log-probs, entropies and gradients on the padded rows."""
    from transformers import AutoTokenizer

    rows = make_rows(AutoTokenizer.from_pretrained(tiny_model_dir))
    rows[0] = prepend_prompt(rows[0], rows[1]["input_ids"][:9])  # a longer prompt: the others are left-padded
    # each sample its own sequence (shared prefixes, checked against this unshared packing in
    # tests/test_trainer_shared_prefix.py, would pack the common prompt once)
    tr = make_trainer(HarnessTrainer, tiny_model_dir, write_samples(tmp_path, rows), shared_prefix=False)
    batch = tr.fixed_batch()
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    keep = batch["completion_ids"].size(1)
    assert bool((batch["prompt_mask"] == 0).any())  # padding, dropped when packed
    assert len(batch["packed"].bounds) == len(tr.data.samples) + 1  # one packed row of every sample
    params = [p for p in tr.model.parameters() if p.requires_grad]

    def run(fn):
        tr.model.zero_grad(set_to_none=True)
        logps, entropy = fn()
        (logps * batch["completion_mask"]).sum().backward()
        return logps.detach(), entropy.detach(), [p.grad.clone() for p in params]

    every = run(lambda: GRPOTrainer._get_per_token_logps_and_entropies(tr, tr.model, ids, attn, keep,
                                                                       compute_entropy=True)[:2])
    packed = run(lambda: tr.policy_logps(tr.model, batch))
    m = batch["completion_mask"].bool()
    torch.testing.assert_close(packed[0][m], every[0][m])
    torch.testing.assert_close(packed[1][m], every[1][m])
    assert bool((packed[0][~m] == 0).all())
    for a, b in zip(packed[2], every[2]):
        # Another attention kernel (per sequence, no mask): float32 sums in another order
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))


def test_drift_names_member_and_version():
    class OlderTrl(GRPOTrainer):  # a TRL whose _compute_loss lost `inputs` and whose flag flipped
        loss_is_scaled_for_ga = False

        def _compute_loss(self, model):
            return None

    problems = trl_private.drift(base=OlderTrl)
    v = trl_private.trl_version()
    assert f"trl {v}: GRPOTrainer._compute_loss has no parameter(s) inputs" in problems
    assert f"trl {v}: GRPOTrainer.loss_is_scaled_for_ga is False, expected True" in problems

    class Unfused(torch.nn.Module):  # a model without TRL's fused head: plain logits come back
        def forward(self, **_):
            return types.SimpleNamespace(logits=torch.zeros(1))

    trainer = types.SimpleNamespace(accelerator=types.SimpleNamespace(autocast=contextlib.nullcontext))
    with pytest.raises(RuntimeError, match=rf"trl {re.escape(v)}: the model's forward\(fused_lm_head=True\) returned no log_probs"):
        trl_private.fused_logps(trainer, Unfused(), False, input_ids=None)
