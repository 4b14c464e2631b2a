"""PACT (docs/methods.md §6.4): per-task gate, trace-conditioned surrogate, component-aware SFT.

- Gate z_i ~ Bernoulli(q) per prompt (task) and pass over the samples (the paper's z_i^(e)), from a
  hash of (seed, task, epoch): every rollout of the prompt gets the same gate wherever the shuffle
  puts it, reproducible and independent of batch order (`pact_gate: step` redraws it every
  optimizer step). z = 1 anchors (plain surrogate), z = 0 trains on the trace.
- Trace rows: the privileged block "Reference trace (training only): …" is inserted at the end of
  the first user message; the rollout's own tokens are unchanged, only shifted. Such a row is an
  ordinary sample with a longer prompt, so log-probs, logp_old (`ratio_to: round`: scored once at
  the run's start, under the c^h its step will show) and the reference KL are all taken under c^h.
- SFT: −(1/Z)Σ m_n log π(h*_n | x, h*_<n): x is the rollout's own prompt tokens (system prompt and
  tools schema as the policy saw them), h* the expert turns rendered with the chat template after
  it; m = 1 on the active reasoning prefix, λ_a(s) on complete tool-call spans, 0 elsewhere; scored
  at temperature 1 whatever the sampling temperature (`unit_temperature`).
- Total per optimizer step: the mean over the step's prompts of the paper's per-prompt loss
  L_i = (1 − z_i)(L^h_RL(i) + β_SFT·L_SFT(i)) + z_i·L^x_RL(i), each RL term the token mean over the
  prompt's rows (`prompt_mean`, the default aggregation; another `--loss-agg` replaces the RL part by
  that aggregation over all rows); prompts and SFT sequences are counted over the whole step (all
  micro-batches and processes), see trainer/normalise.py.
- The reasoning-prefix level limits the privileged block as well as the SFT targets (the paper's
  "progressively closer to the prompt-only setting"); `pact_level_limits_context: false` keeps
  the block at level 4.

Expert trace shape (tasks.parquet `expert_trace`): {"turns": [{"reasoning_segments": [{"text",
"explicit_call_preview"}], "tool_call": {"name", "arguments"} | null, "observation": str | null}]}.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch

from harnessrl.errors import UserError
from harnessrl.pact_levels import reasoning_level, reasoning_prefix
from harnessrl.toolcalls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from harnessrl.trainer.data import Sample, collate
from harnessrl.trainer.diagnostics import masked_sums
from harnessrl.trainer.grpo import HarnessTrainer, prompt_key
from harnessrl.trainer.packing import pack, packed_logps
from harnessrl.trainer.sft import span_weights

_MARK = "\x00HARNESSRL\x00"
log = logging.getLogger(__name__)


@contextmanager
def unit_temperature(causal_lm, temperature: float):
    """TRL's fused head divides the logits by the sampling temperature T, fixed when the head is put
    on the model; L_SFT is scored at T = 1 (the paper's). For this pass the backbone's last hidden
    state h is multiplied by T, so the head's logits (T·h)W/T are hW, the unscaled ones: exact for an
    LM head without bias and without logit soft-capping (refused otherwise)."""
    if temperature == 1.0:
        yield
        return
    base = causal_lm.get_base_model() if hasattr(causal_lm, "get_base_model") else causal_lm
    if base.get_output_embeddings().bias is not None or getattr(base.config.get_text_config(), "final_logit_softcapping", None):
        raise UserError("pact scores L_SFT at temperature 1 by scaling the hidden state, which needs an LM head without "
                        "bias or logit soft-capping: train this model at temperature 1")

    def scale(_module, _args, out):
        out.last_hidden_state = out.last_hidden_state * temperature
        return out

    handle = base.base_model.register_forward_hook(scale)
    try:
        yield
    finally:
        handle.remove()


def gate(seed: int, task_id: str, draw: int, q: float) -> int:
    """z_i ∈ {0, 1}, P(z = 1) = q; `draw` is the epoch (or the step, with `pact_gate: step`)."""
    h = hashlib.sha256(f"{seed}:{task_id}:{draw}".encode()).digest()
    u = int.from_bytes(h[:8], "big") / 2**64
    return int(u < q)


def lambda_a(step: int, total: int, start: float = 0.8, end: float = 0.2) -> float:
    return start - (start - end) * min(step / max(total, 1), 1.0)


def _call_json(call: dict) -> str:
    return json.dumps({"name": call["name"], "arguments": call.get("arguments", {})})


def privileged_block(trace: dict, level: int = 4) -> str:
    lines = ["", "", "Reference trace (training only):"]
    for i, turn in enumerate(trace.get("turns", []), 1):
        lines.append(f"Step {i}:")
        prefix = reasoning_prefix(turn.get("reasoning_segments", []), level)
        if prefix:
            lines.append(f"Reasoning: {prefix}")
        if turn.get("tool_call"):
            lines.append(f"Tool call: {_call_json(turn['tool_call'])}")
        if turn.get("observation") is not None:
            lines.append(f"Observation: {turn['observation']}")
    return "\n".join(lines)


def _find(seq: list[int], sub: list[int], start: int = 0, stop: int | None = None) -> int:
    stop = len(seq) if stop is None else stop
    for i in range(start, stop - len(sub) + 1):
        if seq[i:i + len(sub)] == sub:
            return i
    return -1


def user_message_end(tokenizer, ids: list[int], prompt_len: int) -> int | None:
    """Position of the token that closes the first user message in the prompt (None if not found)."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False)
    pre, post = rendered.split(_MARK, 1)
    header = tokenizer(pre, add_special_tokens=False)["input_ids"][-3:]
    closer = tokenizer(post, add_special_tokens=False)["input_ids"][:1]
    at = _find(ids, header, 0, prompt_len)
    if at < 0 or not closer:
        return None
    end = _find(ids, closer, at + len(header), prompt_len)
    return end if end >= 0 else None


def trace_sample(s: Sample, block_ids: list[int], pos: int) -> Sample:
    """The same sample under c^h: `block_ids` inserted at `pos` (inside the prompt), its tokens and
    advantages unchanged. The behaviour log-probs are dropped (NaN) on every token, not only on the
    block: the rollout's tokens were sampled under x, while logp_old is scored under c^h, so
    π_old(y|c^h)/π_behaviour(y|x) is a ratio between two contexts, not a staleness correction. With
    no recorded log-prob a token weighs w = 1 under `tis` and is left out of behaviour/abs_gap and the
    mismatch metrics (docs/methods.md §6.5), as for any token the server sent none for."""
    n = len(block_ids)

    def ins(values: list, fill: Any) -> list:
        return values[:pos] + [fill] * n + values[pos:]

    return replace(
        s,
        input_ids=s.input_ids[:pos] + block_ids + s.input_ids[pos:],
        loss_mask=ins(s.loss_mask, 0),
        token_class=ins(s.token_class, 0),
        advantage=ins(s.advantage, 0.0),
        behaviour_logprob=[math.nan] * (len(s.behaviour_logprob) + n),
        prompt_len=s.prompt_len + n,
    )


def task_messages(task_input: Any) -> list[dict]:
    if isinstance(task_input, list):
        return [m for m in task_input if isinstance(m, dict)]
    return [{"role": "user", "content": str(task_input or "")}]


def sft_sequence(tokenizer, prompt_ids: list[int], task_input: Any, trace: dict, level: int, lam: float) -> tuple[list[int], list[float]]:
    """The rollout's prompt tokens `prompt_ids` (x, weight 0), then the expert turns rendered with the
    chat template as they would follow the task's messages, with per-token weights m_n."""
    messages = task_messages(task_input)
    spans: list[tuple[str, float]] = []
    for turn in trace.get("turns", []):
        prefix = reasoning_prefix(turn.get("reasoning_segments", []), level)
        msg: dict[str, Any] = {"role": "assistant", "content": ""}
        if prefix:
            msg["reasoning_content"] = prefix
            spans.append((prefix, 1.0))
        if turn.get("tool_call"):
            call = turn["tool_call"]
            msg["tool_calls"] = [{"type": "function", "function": {"name": call["name"], "arguments": call.get("arguments", {})}}]
            spans.append((TOOL_CALL_OPEN, lam))
        messages.append(msg)
        if turn.get("observation") is not None:
            messages.append({"role": "tool", "content": str(turn["observation"])})
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    prompt_text = tokenizer.apply_chat_template(task_messages(task_input), tokenize=False, add_generation_prompt=True)
    if not text.startswith(prompt_text):
        raise UserError("the chat template does not render the expert trace as a continuation of the task prompt")
    # What the model generates after x; tokenised on its own, as the rollout's generated tokens are.
    text = text[len(prompt_text):]
    cursor = 0
    ranges = []
    for piece, w in spans:
        at = text.find(piece, cursor)
        if at < 0:
            continue
        end = at + len(piece)
        if piece == TOOL_CALL_OPEN:  # the complete call span, tags included
            close = text.find(TOOL_CALL_CLOSE, at)
            end = close + len(TOOL_CALL_CLOSE) if close >= 0 else end
        ranges.append((at, end, w))
        cursor = end
    ids, weights = span_weights(tokenizer, text, ranges)
    return list(prompt_ids) + ids, [0.0] * len(prompt_ids) + weights


def sft_row_weights(rows: list[tuple[str, bool]], everyone: list[tuple[str, bool]]) -> list[float]:
    """Weight of each local row's L_SFT: 1/(T·c), T the tasks of the step, c the copies of the task's
    SFT sequence in the step (one per process that holds a trace row of it); 0 without one."""
    tasks = {k for k, _ in everyone}
    copies: dict[str, int] = {}
    for k, has in everyone:
        copies[k] = copies.get(k, 0) + int(has)
    return [1.0 / (len(tasks) * copies[k]) if has else 0.0 for k, has in rows]


class PactTrainer(HarnessTrainer):
    algo = "pact"

    def __init__(self, *args, **kwargs):
        self._block_cache: dict[tuple[str, int], list[int]] = {}
        self._extra_tokens: dict[str, int] = {}
        super().__init__(*args, **kwargs)
        traces = [t.expert_trace for t in self.data.tasks.values() if t.expert_trace]
        if not traces:
            log.warning("pact: no task has an expert trace, so every prompt is an anchor (the plain surrogate, no SFT)")
        elif not any(seg.get("text") for tr in traces for turn in tr.get("turns", []) for seg in turn.get("reasoning_segments") or []):
            log.warning("pact: the expert traces carry no reasoning, so the reasoning-level schedule has nothing to act "
                        "on: only λ_a anneals (the SFT targets and c^h are the tool calls and observations)")

    def sample_tokens(self, sample: Sample) -> int:
        """At most: the rollout's tokens, the privileged block, and its task's SFT sequence (all at level 4, the longest)."""
        task = self.data.tasks.get(sample.task_id) if sample.task_id else None
        if not (task and task.expert_trace):
            return len(sample.input_ids)
        if sample.task_id not in self._extra_tokens:
            _, weights = sft_sequence(self.tok, [], task.input, task.expert_trace, 4, 1.0)
            self._extra_tokens[sample.task_id] = len(self._block(sample.task_id, task.expert_trace, 4)) + len(weights)
        return len(sample.input_ids) + sample.prompt_len + self._extra_tokens[sample.task_id]  # RL row + SFT sequence (x + expert)

    def schedule(self, step: int | None = None) -> tuple[float, int]:
        """(λ_a, level) at this run's `step` (default: the current one) of the whole training (config:
        pact_schedule_start / _steps)."""
        s = self.cfg.pact_schedule_start + (self.state.global_step if step is None else step)
        S = self.cfg.pact_schedule_steps or self.args.max_steps
        return lambda_a(s, S, self.cfg.pact_lambda_start, self.cfg.pact_lambda_end), reasoning_level(s, S)

    def _block(self, task_id: str, trace: dict, level: int) -> list[int]:
        lvl = level if self.cfg.pact_level_limits_context else 4
        key = (task_id, lvl)
        if key not in self._block_cache:
            self._block_cache[key] = self.tok(privileged_block(trace, lvl), add_special_tokens=False)["input_ids"]
        return self._block_cache[key]

    def build_batch(self, samples: list[Sample]) -> dict[str, torch.Tensor]:
        step = self.plan_step()
        lam, level = self.schedule(step)
        draw = step // self.plan.per_epoch if self.cfg.pact_gate == "epoch" else step
        rows, gates, sft_rows = [], [], []
        seen: set[str] = set()
        for s in samples:
            task = self.data.tasks.get(s.task_id) if s.task_id else None
            trace = task.expert_trace if task else None
            z = 1 if not trace else gate(self.cfg.seed, s.task_id, draw, self.cfg.pact_q)
            gates.append(float(z))
            if z:
                rows.append(s)
                sft_rows.append(None)
                continue
            pos = user_message_end(self.tok, s.input_ids, s.prompt_len)
            if pos is None:
                raise UserError(f"rollout {s.rollout_id}: no end of the first user message in its prompt, "
                                "so there is no place for PACT's privileged block")
            rows.append(trace_sample(s, self._block(s.task_id, trace, level), pos))
            first = s.task_id not in seen
            seen.add(s.task_id)
            prompt = s.input_ids[:s.prompt_len]
            sft_rows.append(sft_sequence(self.tok, prompt, task.input, trace, level, lam) if first else None)
        batch = collate(rows, self.pad_id, self.accelerator.device)
        batch["gate"] = torch.tensor(gates, device=self.accelerator.device)
        L = max([len(r[0]) for r in sft_rows if r] or [1])
        sft_ids = torch.full((len(rows), L), self.pad_id, dtype=torch.long)
        sft_w = torch.zeros((len(rows), L))
        sft_attn = torch.zeros((len(rows), L), dtype=torch.long)
        for i, r in enumerate(sft_rows):
            if r:
                sft_ids[i, :len(r[0])] = torch.tensor(r[0])
                sft_w[i, :len(r[1])] = torch.tensor(r[1])
                sft_attn[i, :len(r[0])] = 1
        batch.update(sft_ids=sft_ids, sft_weights=sft_w, sft_mask=sft_attn)
        return {k: v.to(self.accelerator.device) for k, v in batch.items()}

    def step_weights(self, batch, samples):
        from accelerate.utils import gather_object

        out = super().step_weights(batch, samples)
        rows = list(zip([prompt_key(s) for s in samples], (batch["sft_weights"][:, 1:].sum(-1) > 0).tolist()))
        everyone = gather_object(rows) if self.accelerator.num_processes > 1 else rows
        out["sft_row_weight"] = torch.tensor(sft_row_weights(rows, everyone), device=batch["sft_weights"].device)
        return out

    def prepare_micro_batch(self, batch, samples, reference=True):
        """Also the rows' SFT sequences, packed apart from the RL rows (their own forward pass), scored
        from each one's first weighted token (the rollout's prompt x before it has weight 0)."""
        batch = super().prepare_micro_batch(batch, samples, reference)
        w, lengths = batch["sft_weights"], batch["sft_mask"].sum(1).tolist()
        first = [int(torch.nonzero(w[i, 1:] > 0)[0]) + 1 if bool((w[i, 1:] > 0).any()) else lengths[i] for i in range(len(lengths))]
        width = max([n - f for n, f in zip(lengths, first)] + [1])
        aligned = torch.zeros((len(lengths), width), device=w.device)
        for i, (n, f) in enumerate(zip(lengths, first)):
            aligned[i, :n - f] = w[i, f:n]
        seqs = [batch["sft_ids"][i, :n] if n > f else batch["sft_ids"][i, :0] for i, (n, f) in enumerate(zip(lengths, first))]
        batch["sft_packed"] = pack(seqs, first, width, w.device) if any(s.numel() for s in seqs) else None
        batch["sft_token_weights"] = aligned
        return batch

    def sft_losses(self, model, inputs) -> torch.Tensor:
        """(B,) L_SFT,i of the rows that carry a trace sequence (Z > 0), 0 on the other rows."""
        w = inputs["sft_token_weights"]
        if not bool((w > 0).any()):
            return torch.zeros(w.size(0), device=w.device)
        with unit_temperature(self.accelerator.unwrap_model(model), self.temperature):
            logps, _ = packed_logps(self, model, inputs["sft_packed"])
        return -(logps * w).sum(-1) / w.sum(-1).clamp(min=1e-12)  # 0 on rows without a sequence

    def sampled_context_rows(self, inputs):
        # a trace row (z = 0) is scored under c^h, its tokens were sampled under x: its logp_old −
        # logp_behaviour would be the privileged block's effect, not the engine's mismatch (§6.5).
        # trace_sample already drops its behaviour log-probs; this keeps the rows out of the metrics
        # should a row ever carry them
        return inputs["gate"]

    def objective(self, model, inputs):
        logps, entropy = self.policy_logps(model, inputs)
        per_token, old = self.per_token_loss(logps, inputs)
        mask, g = inputs["loss_mask"], inputs["gate"][:, None]
        self.log_token_stats(logps, old, entropy, inputs)
        rl = self.share(per_token, inputs["loss_weights"])
        sft = self.sft_losses(model, inputs)
        sft_term = self.share(sft, inputs["sft_row_weight"])
        has_sft = inputs["sft_row_weight"] > 0
        self._log_mean("pact/anchor_fraction", inputs["gate"].sum(), inputs["gate"].numel())  # of the step's rows
        lam, level = self.schedule()
        self._log_mean("pact/lambda_a", lam)
        self._log_mean("pact/level", level)
        return {
            "loss": rl + self.cfg.pact_beta_sft * sft_term,
            "rl_anchor": masked_sums(per_token.detach(), mask * g),
            "rl_trace": masked_sums(per_token.detach(), mask * (1 - g)),
            "sft": (sft.detach()[has_sft].sum(), has_sft.sum()),  # the mean L_SFT of the step's sequences
        }
