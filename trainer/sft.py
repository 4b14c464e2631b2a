"""`harnessrl sft`: plain supervised fine-tuning on expert traces (the warm start before RL).

A task line (the `harnessrl tasks import` format, plus optional `tools`: the schemas the harness
sends) becomes one sequence: the task's input messages followed by the expert's messages,
rendered with the model's own chat template. As in PACT's component-aware SFT, only what the
model itself would generate is a target — reasoning, complete tool-call spans (weight
`call_weight`), the final answer and its end-of-turn token; prompts and tool observations get
weight 0. The loss is Σ w·nll / Σ w over the batch.

A batch is one packed row (trainer/packing.py), and a prefix that its sequences share (the system
prompt and tools every task of a family sends) is computed once (`shared_prefix`, on by default;
exact: tests/test_trainer_sft.py); the output layer runs only where a token is a target.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harnessrl.errors import UserError
from harnessrl.tasks_file import parse_line
from harnessrl.toolcalls import TOOL_CALL_OPEN
from harnessrl.tool_rendering import dropped_tools_message, template_renders_tools


@dataclass
class SftConfig:
    tasks: str
    model: str
    out: str
    steps: int = 200
    batch_size: int = 8
    lr: float = 3e-3
    weight_decay: float = 0.0
    call_weight: float = 1.0  # λ_a on complete tool-call spans (PACT anneals it; warm start keeps it fixed)
    seed: int = 0
    shared_prefix: bool = True  # each prefix the batch's sequences share computed once (exact)


def read_sft_tasks(path: str | Path) -> list[tuple[list[dict], list[dict], list[dict] | None]]:
    """(input messages, expert messages, tools) for every line with an expert trace."""
    from harnessrl.trainer.pact import task_messages

    path = Path(path)
    if not path.is_file():
        raise UserError(f"tasks file not found: {path}")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = parse_line(line, f"{path}:{n}")
        if row.expert_trace:
            tools = json.loads(line).get("tools")
            rows.append((task_messages(row.input), row.expert_trace, tools))
    if not rows:
        raise UserError(f"{path}: no task has an expert_trace to fine-tune on")
    return rows


def weighted_sequence(tokenizer, prompt: list[dict], expert: list[dict], tools: list[dict] | None,
                      call_weight: float) -> tuple[list[int], list[float]]:
    """Token ids of the whole conversation and a weight per token (0 outside assistant turns)."""
    messages = prompt + expert
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    spans: list[tuple[int, int, float]] = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant" or i < len(prompt):
            continue
        # The assistant turn is what rendering messages[:i+1] adds after the generation prompt of messages[:i].
        before = tokenizer.apply_chat_template(messages[:i], tools=tools, tokenize=False, add_generation_prompt=True)
        upto = tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False)
        if not (text.startswith(before) and text.startswith(upto)):
            raise UserError("the chat template does not render the conversation incrementally; cannot locate assistant turns")
        start, end = len(before), len(upto.rstrip("\n"))
        spans.append((start, end, 1.0))
        call_at = text.find(TOOL_CALL_OPEN, start, end)
        if call_at >= 0:
            spans.append((call_at, end, call_weight))
    return span_weights(tokenizer, text, spans)


def span_weights(tokenizer, text: str, spans: list[tuple[int, int, float]]) -> tuple[list[int], list[float]]:
    """`text` tokenised, and each token's weight: that of the latest span (character range) it
    overlaps, so a tool-call span inside an assistant turn overrides the turn's weight; 0 outside
    every span. Shared by the warm start and PACT's L_SFT, so both weigh call spans the same way."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    weights = []
    for a, b in enc["offset_mapping"]:
        inside = [w for s, e, w in spans if a < e and b > s]
        weights.append(inside[-1] if inside else 0.0)
    return list(enc["input_ids"]), weights


def sft(cfg: SftConfig, after_step: Callable[[int, Any], None] | None = None) -> Path:
    """Fine-tune and save to `cfg.out`; `after_step(step, model)` after each optimizer step (benchmarks
    evaluate along the way)."""
    import torch
    from rich.progress import Progress

    from harnessrl.trainer.packing import use_packed_attention
    from harnessrl.trainer.run import load_model

    rows = read_sft_tasks(cfg.tasks)
    model, tokenizer = load_model(cfg.model)
    if any(tools for _, _, tools in rows) and not template_renders_tools(tokenizer):
        raise UserError(dropped_tools_message(str(cfg.model)))  # it would teach calls of tools never shown
    seqs = [weighted_sequence(tokenizer, p, e, t, cfg.call_weight) for p, e, t in rows]
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    use_packed_attention(model)
    model.train()
    with Progress() as progress:
        bar = progress.add_task("sft", total=cfg.steps)
        for step in range(cfg.steps):
            loss = batch_loss(model, [seqs[rng.randrange(len(seqs))] for _ in range(cfg.batch_size)], cfg.shared_prefix)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            progress.update(bar, advance=1, description=f"sft loss {loss.item():.3f}")
            if after_step is not None:
                after_step(step + 1, model)
    model.eval()
    out = Path(cfg.out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def batch_loss(model, batch: list[tuple[list[int], list[float]]], shared_prefix: bool = True):
    """Σ w·nll / Σ w of the batch, as one packed row; each sequence's targets from its first weighted token."""
    import torch

    from harnessrl.trainer.packing import pack
    from harnessrl.trainer.prefix_tree import MIN_SHARED

    first = [next((t for t, w in enumerate(ws) if w > 0 and t > 0), len(ws)) for _, ws in batch]
    width = max(1, max(len(ids) - f for (ids, _), f in zip(batch, first)))
    packed = pack([torch.tensor(ids) for ids, _ in batch], first, width, min_shared=MIN_SHARED if shared_prefix else None)
    weights = torch.zeros(packed.valid.shape)
    for i, ((_, ws), f) in enumerate(zip(batch, first)):
        weights[i, :len(ws) - f] = torch.tensor(ws[f:])
    # the head only where a target is predicted: position p of the row predicts the label at p + 1
    at = torch.unique(packed.index[packed.valid])
    logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, packed_bounds=packed.bounds,
                   packed_tree=packed.tree, logits_to_keep=at).logits[0].float()
    nll_at = torch.nn.functional.cross_entropy(logits, packed.labels[0, at + 1], reduction="none")
    where = torch.zeros(packed.input_ids.shape[1], dtype=torch.long)
    where[at] = torch.arange(at.numel())
    nll = torch.where(packed.valid, nll_at[where[packed.index]], 0.0)
    return (nll * weights).sum() / weights.sum().clamp_min(1e-8)


def sft_loss(model, tokenizer, seqs: list[tuple[list[int], list[float]]]) -> float:
    """Mean weighted NLL of the sequences (to check that fine-tuning lowers it)."""
    import torch

    total, weight = 0.0, 0.0
    with torch.no_grad():
        for ids, ws in seqs:
            x = torch.tensor([ids])
            logits = model(input_ids=x).logits[0, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="none")
            w = torch.tensor(ws[1:])
            total += float((nll * w).sum())
            weight += float(w.sum())
    return total / max(weight, 1e-8)
