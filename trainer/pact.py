"""PACT (METHODS §6.4): per-task gate, trace-conditioned surrogate, component-aware SFT.

- Gate z_i ~ Bernoulli(q) per task per step, from a hash of (seed, task, step): reproducible and
  independent of batch order. z = 1 anchors (plain surrogate), z = 0 trains on the trace.
- Trace rows: the privileged block "Reference trace (training only): …" is inserted at the end of
  the first user message; the rollout's own tokens are unchanged, only shifted. Such a row is an
  ordinary sample with a longer prompt, so log-probs, logp_old (recomputed in the same batch) and
  the reference KL are all taken under c^h.
- SFT: −(1/Z)Σ m_n log π(h*_n | x, h*_<n) on the expert trace rendered with the chat template;
  m = 1 on the active reasoning prefix, λ_a(s) on complete tool-call spans, 0 elsewhere.
- Total per micro-batch: L_RL (configured aggregation over all rows) + β_SFT · Σ_{trace tasks} L_SFT,i / #tasks,
  i.e. the mean over tasks of L^x_RL or L^h_RL + β_SFT·L_SFT.

Expert trace shape (tasks.parquet `expert_trace`): {"turns": [{"reasoning_segments": [{"text",
"explicit_call_preview"}], "tool_call": {"name", "arguments"} | null, "observation": str | null}]}.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace
from typing import Any

import torch

from harnessrl.trainer.data import Sample, aggregate, collate
from harnessrl.trainer.grpo import HarnessTrainer

_MARK = "\x00HARNESSRL\x00"


def gate(seed: int, task_id: str, step: int, q: float) -> int:
    """z_i ∈ {0, 1}, P(z = 1) = q."""
    h = hashlib.sha256(f"{seed}:{task_id}:{step}".encode()).digest()
    u = int.from_bytes(h[:8], "big") / 2**64
    return int(u < q)


def lambda_a(step: int, total: int, start: float = 0.8, end: float = 0.2) -> float:
    return start - (start - end) * min(step / max(total, 1), 1.0)


def reasoning_level(step: int, total: int) -> int:
    """L4 at the start, down to L0: 4 − min(4, ⌊5s/S⌋)."""
    return 4 - min(4, (5 * step) // max(total, 1))


def reasoning_prefix(segments: list[dict], level: int) -> str:
    """The first ⌈level/4 · n⌉ of the n safe segments (those before the first explicit call preview)."""
    safe = []
    for seg in segments or []:
        if seg.get("explicit_call_preview"):
            break
        safe.append(seg["text"])
    n = math.ceil(level / 4 * len(safe))
    return "\n\n".join(safe[:n])


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


def user_message_end(tokenizer, ids: list[int], prompt_len: int) -> int:
    """Position of the token that closes the first user message in the prompt (0 if not found)."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False)
    pre, post = rendered.split(_MARK, 1)
    header = tokenizer(pre, add_special_tokens=False)["input_ids"][-3:]
    closer = tokenizer(post, add_special_tokens=False)["input_ids"][:1]
    at = _find(ids, header, 0, prompt_len)
    if at < 0 or not closer:
        return 0
    end = _find(ids, closer, at + len(header), prompt_len)
    return end if end >= 0 else 0


def trace_sample(s: Sample, block_ids: list[int], pos: int) -> Sample:
    """The same sample under c^h: `block_ids` inserted at `pos` (inside the prompt), nothing else changed."""
    n = len(block_ids)

    def ins(values: list, fill: Any) -> list:
        return values[:pos] + [fill] * n + values[pos:]

    return replace(
        s,
        input_ids=s.input_ids[:pos] + block_ids + s.input_ids[pos:],
        loss_mask=ins(s.loss_mask, 0),
        token_class=ins(s.token_class, 0),
        advantage=ins(s.advantage, 0.0),
        behaviour_logprob=ins(s.behaviour_logprob, math.nan),
        prompt_len=s.prompt_len + n,
    )


def task_messages(task_input: Any) -> list[dict]:
    if isinstance(task_input, list):
        return [m for m in task_input if isinstance(m, dict)]
    return [{"role": "user", "content": str(task_input or "")}]


def sft_sequence(tokenizer, task_input: Any, trace: dict, level: int, lam: float) -> tuple[list[int], list[float]]:
    """Expert trace rendered after the task prompt, with per-token weights m_n."""
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
            spans.append(("<tool_call>", lam))
        messages.append(msg)
        if turn.get("observation") is not None:
            messages.append({"role": "tool", "content": str(turn["observation"])})
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    # Character ranges with weights, found left to right after the prompt.
    prompt_text = tokenizer.apply_chat_template(task_messages(task_input), tokenize=False, add_generation_prompt=True)
    cursor = len(prompt_text) if text.startswith(prompt_text) else 0
    ranges = []
    for piece, w in spans:
        at = text.find(piece, cursor)
        if at < 0:
            continue
        end = at + len(piece)
        if piece == "<tool_call>":  # the complete call span, tags included
            close = text.find("</tool_call>", at)
            end = close + len("</tool_call>") if close >= 0 else end
        ranges.append((at, end, w))
        cursor = end
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    weights = []
    for a, b in enc["offset_mapping"]:
        weights.append(max((w for s, e, w in ranges if a < e and b > s), default=0.0))
    return list(enc["input_ids"]), weights


class PactTrainer(HarnessTrainer):
    algo = "pact"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._block_cache: dict[tuple[str, int], list[int]] = {}

    def schedule(self) -> tuple[float, int]:
        s, S = self.state.global_step, self.args.max_steps
        return lambda_a(s, S, self.cfg.pact_lambda_start, self.cfg.pact_lambda_end), reasoning_level(s, S)

    def _block(self, task_id: str, trace: dict, level: int) -> list[int]:
        lvl = level if self.cfg.pact_level_limits_context else 4
        key = (task_id, lvl)
        if key not in self._block_cache:
            self._block_cache[key] = self._tokenizer(privileged_block(trace, lvl), add_special_tokens=False)["input_ids"]
        return self._block_cache[key]

    def build_batch(self, samples: list[Sample]) -> dict[str, torch.Tensor]:
        lam, level = self.schedule()
        step = self.state.global_step
        rows, gates, sft_rows = [], [], []
        seen: set[str] = set()
        for s in samples:
            task = self.data.tasks.get(s.task_id) if s.task_id else None
            trace = task.expert_trace if task else None
            z = 1 if not trace else gate(self.cfg.seed, s.task_id, step, self.cfg.pact_q)
            gates.append(float(z))
            if z:
                rows.append(s)
                sft_rows.append(None)
                continue
            pos = user_message_end(self._tokenizer, s.input_ids, s.prompt_len)
            rows.append(trace_sample(s, self._block(s.task_id, trace, level), pos))
            first = s.task_id not in seen
            seen.add(s.task_id)
            sft_rows.append(sft_sequence(self._tokenizer, task.input, trace, level, lam) if first else None)
        batch = collate(rows, self.pad_id, self.accelerator.device)
        batch["gate"] = torch.tensor(gates, device=self.accelerator.device)
        task_ids = {s.task_id or s.rollout_id: i for i, s in enumerate(samples)}
        batch["task_index"] = torch.tensor([list(task_ids).index(s.task_id or s.rollout_id) for s in samples], device=self.accelerator.device)
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

    def sft_losses(self, model, inputs) -> torch.Tensor:
        """Per-task L_SFT for the rows that carry a trace sequence (Z > 0 only)."""
        w = inputs["sft_weights"][:, 1:]
        rows = w.sum(-1) > 0
        if not bool(rows.any()):
            return torch.zeros(0, device=w.device)
        ids, attn, w = inputs["sft_ids"][rows], inputs["sft_mask"][rows], w[rows]
        # Score only from the first weighted token on (the task prompt has weight 0).
        first = int((w > 0).float().argmax(-1).min())
        logps, _, _ = self._get_per_token_logps_and_entropies(model, ids, attn, ids.size(1) - 1 - first)
        w = w[:, first:]
        return -(logps * w).sum(-1) / w.sum(-1)

    def objective(self, model, inputs):
        logps, entropy = self.policy_logps(model, inputs)
        per_token, old = self.per_token_loss(logps, inputs)
        mask, g = inputs["loss_mask"], inputs["gate"][:, None]
        self.log_token_stats(logps, old, entropy, inputs)
        rl = self.aggregate(per_token, mask, inputs)
        sft = self.sft_losses(model, inputs)
        n_tasks = int(inputs["task_index"].unique().numel())
        sft_term = sft.sum() / n_tasks if sft.numel() else torch.zeros((), device=rl.device)
        self._log("pact/anchor_fraction", inputs["gate"].mean())
        lam, level = self.schedule()
        self._log("pact/lambda_a", lam)
        self._log("pact/level", level)
        return {
            "loss": rl + self.cfg.pact_beta_sft * sft_term,
            "rl_anchor": aggregate(per_token.detach(), mask * g, "token_mean"),
            "rl_trace": aggregate(per_token.detach(), mask * (1 - g), "token_mean"),
            "sft": sft.detach().mean() if sft.numel() else torch.zeros(()),
        }
