"""The warm start's batch loss (trainer/sft.py): one packed row, shared prefixes computed once and
the output layer only at targets, against the definition on a padded batch — the same loss and
gradients, with and without sharing."""

from __future__ import annotations

import pytest
import torch
from trainer_fixtures import padded_sft_loss


def _grads(model, loss):
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_packed_batch_loss_is_the_padded_one(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harnessrl.harness_examples.lookup import tasks as lookup_tasks
    from harnessrl.trainer.packing import pack, use_packed_attention
    from harnessrl.trainer.prefix_tree import MIN_SHARED
    from harnessrl.trainer.sft import batch_loss, read_sft_tasks, weighted_sequence

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = read_sft_tasks(lookup_tasks.write(lookup_tasks.generate(6, seed=1), tmp_path / "t.jsonl"))
    # uneven call weights, and one sequence twice (a batch drawn with replacement)
    batch = [weighted_sequence(tok, *r, call_weight=w) for r, w in zip(rows, (1.0, 0.5, 2.0, 1.0, 1.0, 0.25))]
    batch.append(batch[2])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    want = padded_sft_loss(model, batch, tok.pad_token_id)
    g_want = _grads(model, want)
    use_packed_attention(model)
    packed = pack([torch.tensor(ids) for ids, _ in batch], [1] * len(batch), 512, min_shared=MIN_SHARED)
    total = sum(len(ids) for ids, _ in batch)
    assert packed.tokens < total / 2, (packed.tokens, total)  # the tasks' common prompt, once
    for shared in (True, False):
        got = batch_loss(model, batch, shared_prefix=shared)
        assert got.item() == pytest.approx(want.item(), abs=1e-6), shared
        g = _grads(model, got)
        assert g.keys() == g_want.keys()
        for name, v in g.items():
            assert torch.allclose(v, g_want[name], atol=1e-6, rtol=1e-4), (shared, name, float((v - g_want[name]).abs().max()))
