"""Shared-prefix training (trainer/prefix_tree.py, trainer/packing.py): each prefix that a micro-batch's
samples share is computed once, and nothing changes but the work. The tree by hand; the packed row's
labels and positions against the unshared one; then for every algorithm (grpo, capo routed, matpo,
pact with its c^h rows) one step with and without sharing: the same per-token log-probs (1e-5), loss
and gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_fixtures import EXPERT_TRACE, make_rows, prepend_prompt, write_samples

from harnessrl.trainer.packing import pack
from harnessrl.trainer.prefix_tree import Segment, prefix_tree


def _t(*xs: int) -> torch.Tensor:
    return torch.tensor(xs)


@pytest.mark.unit
def test_the_tree_by_hand():
    a = _t(1, 2, 3, 4, 5, 6, 7, 8)
    b = _t(1, 2, 3, 4, 5, 9, 9)
    c = _t(1, 2, 3, 4, 5, 6, 7, 0)
    d = _t(7, 7)
    # a, b, c share depths 0-4; a and c share 0-6. Shared segments end one before the parting and
    # each branch repeats the last shared token
    assert prefix_tree([a, b, c, d], min_shared=2) == [
        Segment(0, 4, (0, 1, 2), -1),  # 1 2 3 4
        Segment(4, 6, (0, 2), 0),  # 5 6 (then 7 in each branch)
        Segment(6, 8, (0,), 1),  # 7 8
        Segment(6, 8, (2,), 1),  # 7 0
        Segment(4, 7, (1,), 0),  # 5 9 9
        Segment(0, 2, (3,), -1),
    ]
    # shorter runs than min_shared stay in each sequence
    assert prefix_tree([a, b, c, d], min_shared=5) == [
        Segment(0, 6, (0, 2), -1), Segment(6, 8, (0,), 0), Segment(6, 8, (2,), 0),
        Segment(0, 7, (1,), -1), Segment(0, 2, (3,), -1)]
    # a continuation whose mask could pass max_mask cells (length left × length) is not shared
    assert prefix_tree([a, b, c, d], min_shared=2, max_mask=4 * 8 - 1) == [
        Segment(0, 6, (0, 2), -1), Segment(6, 8, (0,), 0), Segment(6, 8, (2,), 0),
        Segment(0, 7, (1,), -1), Segment(0, 2, (3,), -1)]
    assert prefix_tree([a, a.clone()], min_shared=2) == [Segment(0, 7, (0, 1), -1), Segment(7, 8, (0,), 0),
                                                         Segment(7, 8, (1,), 0)]


@pytest.mark.unit
def test_the_packed_tree_scores_what_the_unshared_row_scores():
    seqs = [_t(*range(10, 40), 1, 2, 3), _t(*range(10, 40), 4, 5), _t(*range(10, 30)), _t(*range(10, 40), 1, 2, 6)]
    first = [30, 30, 5, 29]
    flat, tree = pack(seqs, first, 4), pack(seqs, first, 4, min_shared=8)
    assert flat.tokens == sum(s.numel() for s in seqs) == 118
    # depths 0-18 once for all four (row 2 ends at 19); 19-28 once for rows 0, 1, 3 (they part at 30);
    # then each row's tail from depth 29 (rows 0 and 3 share 2 more tokens only: under min_shared), row 2's from 19
    assert tree.tokens == 19 + 10 + 4 + 4 + 3 + 1
    assert torch.equal(tree.valid, flat.valid)
    for p in (flat, tree):
        ids, pos, lab = p.input_ids[0], p.position_ids[0], p.labels[0]
        for i, s in enumerate(seqs):
            for j in range(4):
                if not p.valid[i, j]:
                    continue
                t = first[i] + j
                at = int(p.index[i, j])  # predicts token t: holds token t − 1 at depth t − 1, label t after it
                assert (int(ids[at]), int(pos[at]), int(lab[at + 1])) == (int(s[t - 1]), t - 1, int(s[t]))


def _one_step(cls, model_dir: Path, samples: Path, out: Path, **cfg):
    """Loss, gradients before the optimizer step, and the first micro-batch's log-probs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from harnessrl.trainer.config import TrainConfig
    from harnessrl.trainer.data import load_samples

    grads: dict[str, torch.Tensor] = {}

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})

    c = TrainConfig(**{**dict(samples=str(samples), model=str(model_dir), out=str(out), steps=1, batch_size=8,
                              lr=1e-3, report_to="none"), **cfg}).validate()
    peft = None
    if c.lora:
        from peft import LoraConfig

        peft = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    torch.manual_seed(0)
    tr = cls(AutoModelForCausalLM.from_pretrained(model_dir), c, load_samples(samples),
             AutoTokenizer.from_pretrained(model_dir), peft_config=peft,
             trl_args=dict(max_grad_norm=0.0, disable_tqdm=True), callbacks=[Grads()])
    batch = tr.fixed_batch()
    with torch.no_grad():
        logps = tr.policy_logps(tr.model, batch)[0]
    tr.train()
    return tr.state.log_history[0]["loss"], grads, logps, batch["packed"].tokens


CASES = {  # case: (algo, trainer, extra config)
    "grpo": ("grpo", "HarnessTrainer", {}),
    "grpo, LoRA": ("grpo", "HarnessTrainer", {"lora": True}),
    "grpo, micro-batches by a token budget": ("grpo", "HarnessTrainer", {"max_tokens_per_microbatch": 400}),
    "capo": ("capo", "CapoTrainer", {"capo_gamma": 0.5}),
    "matpo": ("matpo", "MatpoTrainer", {}),
    "pact": ("pact", "PactTrainer", {"pact_q": 0.5, "beta": 0.0}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sharing_changes_nothing_but_the_work(case, tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    import harnessrl.trainer.run as run

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = make_rows(tok, n_tasks=2, k=4, rewards=[1.0, 0.0, 0.5, 0.25, 0.0, 1.0, 0.75, 0.5])
    system = rows[1]["input_ids"][:60]  # a long common system prompt ahead of every prompt: shared across tasks too
    rows = [prepend_prompt(r, system) for r in rows]
    algo, name, extra = CASES[case]
    samples = write_samples(tmp_path / "s", rows, {r["task_id"]: EXPERT_TRACE for r in rows} if algo == "pact" else None)
    cls = {c.__name__: c for c in run.TRAINERS.values()}[name]
    if algo == "capo":
        extra = {**extra, "partition": str(tmp_path / "partition.pt")}  # made by the first run, loaded by the second
    off = _one_step(cls, tiny_model_dir, samples, tmp_path / "off", algo=algo, shared_prefix=False, **extra)
    on = _one_step(cls, tiny_model_dir, samples, tmp_path / "on", algo=algo, shared_prefix=True, **extra)
    assert on[3] < off[3] / 2, (on[3], off[3])  # tokens computed (first micro-batch): each prompt once per task
    assert torch.allclose(on[2], off[2], atol=1e-5, rtol=0), float((on[2] - off[2]).abs().max())
    assert on[0] == pytest.approx(off[0], abs=1e-6)
    assert on[1].keys() == off[1].keys() and on[1]
    for k, g in on[1].items():
        assert torch.allclose(g, off[1][k], atol=1e-6, rtol=1e-4), (k, float((g - off[1][k]).abs().max()))
