"""PACT: privileged context keeps the rollout tokens, SFT weights per component, the objective's
composition by hand, logging of the three terms, training lowers the loss."""

import math

import pytest
import torch
from trainer_fixtures import EXPERT_TRACE, make_rows, make_trainer, own_loss, prepend_prompt, start_logps, tiny_samples, write_samples
from transformers import AutoTokenizer

from harnessrl.errors import UserError
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


def test_trace_rows_weigh_one_under_tis(samples, tiny_model_dir):
    """A c^h row's tokens were sampled under x, its logp_old is scored under c^h: no behaviour log-prob,
    so the TIS weight is 1 there and the row is out of the behaviour gap; an anchor row is unchanged."""
    from harnessrl.trainer.losses import behaviour_weight

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    s = load_samples(samples).samples[0]
    pos = user_message_end(tok, s.input_ids, s.prompt_len)
    t = trace_sample(s, tok("Reference trace", add_special_tokens=False)["input_ids"], pos)
    assert any(not math.isnan(v) for v in s.behaviour_logprob)  # the rollout recorded its log-probs …
    assert all(math.isnan(v) for v in t.behaviour_logprob)  # … which its c^h row drops, every token
    # Hand-worked (§6.5's worked case): logp_old = (−1.0, −0.5, −2.0), logp_behaviour = (−1.2, −1.5, −1.7),
    # truncate at C = 2: the anchor row's w = (e^0.2, min(e^1, 2), e^−0.3) = (1.2214, 2, 0.7408);
    # the same tokens in a trace row (behaviour NaN): w = (1, 1, 1), nothing cut
    old = torch.tensor([[-1.0, -0.5, -2.0], [-1.0, -0.5, -2.0]])
    behaviour = torch.tensor([[-1.2, -1.5, -1.7], [math.nan] * 3])
    w, cut = behaviour_weight(old, behaviour, 2.0)
    assert w[0].tolist() == pytest.approx([1.2214, 2.0, 0.7408], abs=1e-4) and w[1].tolist() == [1.0, 1.0, 1.0]
    assert cut.tolist() == [[False, True, False], [False, False, False]]
    # Through the trainer with tis on (as `loop --async` sets it): at ratio 1 and β = 0 each token's
    # loss is −w·A; trace rows −A exactly, anchor rows −min(e^(logp_old + 2), 2)·A (logp_behaviour −2)
    tr = make_trainer(PactTrainer, tiny_model_dir, samples, algo="pact", pact_q=0.5, beta=0.0, tis=True)
    batch = tr.fixed_batch()
    g = batch["gate"]
    assert 0 < float(g.sum()) < len(g)  # both kinds of row in the batch
    logps = start_logps(tr, batch)
    with torch.no_grad():
        loss, old = tr.per_token_loss(logps, {**batch, "old_per_token_logps": logps})
    m, adv, b = batch["loss_mask"] > 0, batch["advantages"], batch["behaviour_logps"]
    trace, anchor = m & (g[:, None] == 0), m & (g[:, None] == 1)
    assert torch.isnan(b[trace]).all() and not torch.isnan(b[anchor]).any()
    assert torch.allclose(loss[trace], -adv[trace], atol=1e-6)
    assert torch.allclose(loss[anchor], -(old[anchor] + 2.0).exp().clamp(max=2.0) * adv[anchor], atol=1e-6)


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
    # the step-wide token mean, kept as `--loss-agg token_mean` (the per-prompt default: test_trainer_paper_defaults)
    tr = make_trainer(PactTrainer, tiny_model_dir, samples, algo="pact", pact_q=0.5, beta=0.0, loss_agg="token_mean")
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
    sft_sum, sequences = terms["sft"]  # the logged mean L_SFT: Σ over the step's sequences ÷ their count
    assert int(sequences) == 4 - sum(z.values()) and float(sft_sum) == pytest.approx(float(sft.sum()), rel=1e-6)
    assert math.isfinite(float(sft_sum)) and float(sft_sum) > 0


def test_pact_trains_and_logs_three_terms(samples, tiny_model_dir):
    tr = make_trainer(PactTrainer, tiny_model_dir, samples, algo="pact")
    assert tr.beta == 0.001  # PACT's default KL coefficient
    batch = tr.fixed_batch()
    old = start_logps(tr, batch)
    before = own_loss(tr, batch, old)
    tr.train()
    assert tr.state.global_step == 2 and own_loss(tr, batch, old) < before - 1e-4
    # Step 0 has only trace prompts (draw 0 gates t0..t3 to 0), step 1 anchors t0 and t2: a term with
    # no token in a step is not logged for it (no 0 that reads as a loss value).
    first, second = tr.state.log_history[:2]
    assert {"loss/rl_trace", "loss/sft", "pact/lambda_a", "pact/level", "kl"} <= set(first) and "loss/rl_anchor" not in first
    assert {"loss/rl_anchor", "loss/rl_trace", "loss/sft"} <= set(second) and second["pact/anchor_fraction"] == 0.5


TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a key up.",
          "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]


@pytest.fixture(scope="module")
def tool_trainer(tmp_path_factory, tiny_model_dir):
    """Rollouts whose prompts carry the tools schema; q = 0, so every task trains on its trace."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = make_rows(tok, n_tasks=2, k=2, tools=TOOLS)
    d = write_samples(tmp_path_factory.mktemp("pact-tools"), rows, {r["task_id"]: EXPERT_TRACE for r in rows})
    tr = make_trainer(PactTrainer, tiny_model_dir, d, algo="pact", pact_q=0.0, beta=0.0)
    return tr, tr.fixed_batch()


def test_sft_prompt_is_the_rollout_prompt(tool_trainer):
    tr, batch = tool_trainer
    has = batch["sft_weights"].sum(-1) > 0
    assert int(has.sum()) == 2  # one SFT sequence per task
    for i, s in enumerate(tr.data.samples):
        if not has[i]:
            continue
        ids = batch["sft_ids"][i][batch["sft_mask"][i] > 0].tolist()
        assert ids[:s.prompt_len] == s.input_ids[:s.prompt_len]  # x exactly as the policy saw it
        assert "# Tools" in tr.tok.decode(ids[:s.prompt_len]) and '"lookup"' in tr.tok.decode(ids[:s.prompt_len])
        assert float(batch["sft_weights"][i, :s.prompt_len].sum()) == 0.0  # the prompt is not a target


def test_sft_loss_and_trace_logps_by_hand(tool_trainer):
    tr, batch = tool_trainer
    model = tr.model
    with torch.no_grad():
        sft = tr.sft_losses(model, batch)
        logps = tr.policy_logps(model, batch)[0]
    block = tr.tok(privileged_block(EXPERT_TRACE), add_special_tokens=False)["input_ids"]
    user = tr.tok("<|im_start|>user\n", add_special_tokens=False)["input_ids"]
    im_end = tr.tok.convert_tokens_to_ids("<|im_end|>")
    checked_sft = 0
    for i, s in enumerate(tr.data.samples):
        # L_SFT = −(1/Z) Σ_n m_n log p(h_n | h_<n), Z = Σ m_n, with log p(h_n | h_<n) from the logits at
        # n − 1 of an unpadded forward pass (reasoning weight 1, tool-call span λ_a = 0.8 at step 0:
        # e.g. 12 reasoning and 20 call tokens give Z = 12 + 0.8·20 = 28).
        w = batch["sft_weights"][i]
        if float(w.sum()) > 0:
            n = int(batch["sft_mask"][i].sum())
            ids = batch["sft_ids"][i, :n]
            with torch.no_grad():
                lp = torch.log_softmax(model(input_ids=ids[None]).logits[0, :-1].float(), -1).gather(1, ids[1:, None])[:, 0]
            m = w[1:n]
            assert {round(v, 6) for v in m.unique().tolist()} == {0.0, 0.8, 1.0}
            assert float(sft[i]) == pytest.approx(float(-(m * lp).sum() / m.sum()), rel=1e-5)
            checked_sft += 1
        # The trace row is x with the privileged block inserted before the <|im_end|> that closes the
        # first user message, then the rollout's tokens: its completion log-probs are those of an
        # unpadded forward pass over that sequence.
        u = next(k for k in range(s.prompt_len) if s.input_ids[k:k + len(user)] == user)
        pos = s.input_ids.index(im_end, u)
        seq = s.input_ids[:pos] + block + s.input_ids[pos:]
        p = s.prompt_len + len(block)
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0, :-1].float(), -1).gather(1, torch.tensor(seq[1:])[:, None])[:, 0]
        c = len(s.input_ids) - s.prompt_len
        assert torch.allclose(logps[i, :c], lp[p - 1:], atol=2e-5), i
    assert checked_sft == 2


def test_privileged_block_needs_the_first_user_message(tmp_path, tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain = tok("Find the capital of alpha.", add_special_tokens=False)["input_ids"]
    rows = []
    for r in make_rows(tok, n_tasks=1, k=2):
        p = r["prompt_len"]
        bare = {**r, **{k: r[k][p:] for k in ("input_ids", "loss_mask", "token_class", "advantage", "behaviour_logprob", "turn_index")}, "prompt_len": 0}
        rows.append(prepend_prompt(bare, plain))  # a prompt without chat headers
    d = write_samples(tmp_path, rows, {"t0": EXPERT_TRACE})
    tr = make_trainer(PactTrainer, tiny_model_dir, d, algo="pact", pact_q=0.0, batch_size=2)
    with pytest.raises(UserError, match=r"rollout r0: no end of the first user message"):
        tr.fixed_batch()
