"""PACT: privileged context keeps the rollout tokens, SFT weights per component, the objective's
composition by hand, logging of the three terms, training lowers the loss."""

import math

import pytest
import torch
from trainer_fixtures import EXPERT_TRACE, make_trainer, own_loss, start_logps, tiny_samples
from transformers import AutoTokenizer

from harnessrl.trainer.data import load_samples
from harnessrl.trainer.pact import PactTrainer, gate, privileged_block, sft_sequence, trace_sample, user_message_end


@pytest.fixture(scope="module")
def samples(tmp_path_factory, tiny_model_dir):
    return tiny_samples(tmp_path_factory.mktemp("pact"), tiny_model_dir, traces=True, n_tasks=4, k=2, rewards=[1.0, 0.0] * 4)


def test_privileged_context_keeps_rollout_tokens(samples, tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    s = load_samples(samples).samples[0]
    pos = user_message_end(tok, s.input_ids, s.prompt_len)
    assert tok.decode(s.input_ids[pos:pos + 1]) == "<|im_end|>"  # the end of the first user message
    block = tok(privileged_block(EXPERT_TRACE), add_special_tokens=False)["input_ids"]
    t = trace_sample(s, block, pos)
    n = len(block)
    assert t.input_ids[t.prompt_len:] == s.input_ids[s.prompt_len:]  # generated tokens unchanged
    assert t.loss_mask[t.prompt_len:] == s.loss_mask[s.prompt_len:] and t.advantage[t.prompt_len:] == s.advantage[s.prompt_len:]
    assert t.prompt_len == s.prompt_len + n and t.input_ids[:pos] == s.input_ids[:pos]
    text = tok.decode(t.input_ids[:t.prompt_len])
    assert "Reference trace (training only):" in text and "Tool call:" in text and "Observation: alpha 7" in text
    assert "The tool call would be" not in text  # explicit call previews are never revealed


def test_sft_weights_by_component(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "Find alpha"}], add_generation_prompt=True, tokenize=False)
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    ids, w = sft_sequence(tok, prompt, "Find alpha", EXPERT_TRACE, level=4, lam=0.5)
    assert ids[:len(prompt)] == prompt and set(w[:len(prompt)]) == {0.0}
    by_weight = {v: tok.decode([i for i, x in zip(ids, w) if x == v]) for v in set(w)}
    # level 4 = both safe segments, weight 1
    assert "The question asks for a capital." in by_weight[1.0] and "lookup tool." in by_weight[1.0]
    # the complete tool-call span, tags included, at λ_a = 0.5
    assert by_weight[0.5].startswith("<tool_call>") and '"lookup"' in by_weight[0.5] and by_weight[0.5].endswith("</tool_call>")
    # observation and prompt get 0
    assert "alpha 7" in by_weight[0.0] and "Find alpha" in by_weight[0.0]
    _, w0 = sft_sequence(tok, prompt, "Find alpha", EXPERT_TRACE, level=0, lam=0.2)
    assert set(w0) == {0.0, 0.2}  # L0: no reasoning is trained


def test_pact_objective_composition(samples, tiny_model_dir):
    tr = make_trainer(PactTrainer, tiny_model_dir, samples, algo="pact", pact_q=0.5, beta=0.0)
    batch = tr.fixed_batch()
    z = {f"t{i}": gate(0, f"t{i}", 0, 0.5) for i in range(4)}
    assert batch["gate"].tolist() == [float(z[s.task_id]) for s in tr.data.samples]
    assert 0 < sum(z.values()) < 4  # this seed gives both anchor and trace tasks
    terms = tr.objective(tr.model, batch)
    # Hand composition: ratio 1 → L_RL = −token-mean(A); L = L_RL + β_SFT · Σ_trace-tasks L_SFT,i / #tasks,
    # with L_SFT,i = −Σ w log p / Σ w over the task's trace (computed once per trace task).
    m, adv = batch["loss_mask"], batch["advantages"]
    rl = -(adv * m).sum() / m.sum()
    sft = tr.sft_losses(tr.model, batch)
    assert int((sft != 0).sum()) == 4 - sum(z.values())  # one SFT sequence per trace task
    assert torch.isclose(terms["loss"], rl + 0.1 * sft.sum() / 4, atol=1e-6)
    # trace rows are longer by the privileged block, anchor rows are not
    plain = load_samples(samples).samples
    lens = (torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)).sum(1).tolist()
    for s, g, n in zip(plain, batch["gate"].tolist(), lens):
        assert (n == len(s.input_ids)) == (g == 1.0)
    assert math.isfinite(float(terms["sft"])) and float(terms["sft"]) > 0


def test_pact_trains_and_logs_three_terms(samples, tiny_model_dir):
    tr = make_trainer(PactTrainer, tiny_model_dir, samples, algo="pact")
    assert tr.beta == 0.001  # PACT's default KL coefficient
    batch = tr.fixed_batch()
    old = start_logps(tr, batch)
    before = own_loss(tr, batch, old)
    tr.train()
    assert tr.state.global_step == 2 and own_loss(tr, batch, old) < before - 1e-4
    logs = tr.state.log_history[0]
    assert {"loss/rl_anchor", "loss/rl_trace", "loss/sft", "pact/lambda_a", "pact/level", "kl"} <= set(logs)
