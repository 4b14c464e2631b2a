"""Compiled-sample fixtures for the trainer tests, written in the compiler's Parquet schema from
real tiny-model token ids (chat template + tokenizer), with token classes from character spans."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from harnessrl.samples import ACTION, ARGS, FORMAT, REASONING, SAMPLE_SCHEMA, TASK_SCHEMA


def _classes(tok, text: str, spans: list[tuple[str, int]]) -> tuple[list[int], list[int]]:
    """Token ids of `text` and a class per token: the class of the first listed span it overlaps
    (spans are given in action > args > reasoning order), else format."""
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ranges = []
    for piece, cls in spans:
        start = text.find(piece)
        assert start >= 0, piece
        ranges.append((start, start + len(piece), cls))
    classes = []
    for a, b in enc["offset_mapping"]:
        cls = next((c for s, e, c in ranges if a < e and b > s), FORMAT)
        classes.append(cls)
    return enc["input_ids"], classes


def make_rows(tok, n_tasks: int = 2, k: int = 2, rewards: list[float] | None = None, tools: list[dict] | None = None) -> list[dict]:
    """One two-call rollout per (task, k): a tool call, an observation, a final answer. With `tools`
    the prompt is rendered with their schemas (in the system message), as a harness's call would be."""
    rows = []
    rewards = rewards or [1.0, 0.0] * (n_tasks * k)
    keys = ["alpha", "beta", "gamma", "delta", "rho", "sigma", "pi", "mu"]
    for t in range(n_tasks):
        for j in range(k):
            e = t * k + j
            key = keys[e % len(keys)]
            user = [{"role": "user", "content": f"Find the capital of {keys[t]}?"}]
            text = tok.apply_chat_template(user, tools=tools, add_generation_prompt=True, tokenize=False)
            prompt = tok(text, add_special_tokens=False)["input_ids"]
            c1 = f'<think>\nI should look up {key}.\n</think>\n\n<tool_call>\n{{"name": "lookup", "arguments": {{"key": "{key}"}}}}\n</tool_call><|im_end|>'
            ids1, cls1 = _classes(tok, c1, [('"lookup"', ACTION), (f'"{key}"', ARGS), (f"I should look up {key}.", REASONING)])
            obs = tok(f"\n<|im_start|>user\n<tool_response>\n{key} {e}\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
            c2 = f"The answer is {key} {e}.<|im_end|>"
            ids2, cls2 = _classes(tok, c2, [(f"{key} {e}", ARGS)])
            ids = prompt + ids1 + obs + ids2
            mask = [0] * len(prompt) + [1] * len(ids1) + [0] * len(obs) + [1] * len(ids2)
            classes = [0] * len(prompt) + cls1 + [0] * len(obs) + cls2
            r = rewards[e]
            mean = sum(rewards[t * k:(t + 1) * k]) / k
            std = (sum((x - mean) ** 2 for x in rewards[t * k:(t + 1) * k]) / max(k - 1, 1)) ** 0.5
            adv = (r - mean) / (std + 1e-6)
            turn = [-1] * len(prompt) + [0] * len(ids1) + [-1] * len(obs) + [1] * len(ids2)
            rows.append(dict(
                sample_id=f"r{e}/planner/c{e}b", rollout_id=f"r{e}", task_id=f"t{t}", group_id=f"t{t}",
                agent="planner", session_id=None, input_ids=ids, loss_mask=mask, token_class=classes,
                advantage=[adv * m for m in mask],
                behaviour_logprob=[(-2.0 if m else None) for m in mask],
                turn_index=turn, call_ids=[f"c{e}a", f"c{e}b"], prompt_len=len(prompt), weight_version="v0",
                outcome_reward=r, reward_breakdown=json.dumps({"outcome": r, "advantage": "grpo"}), retokenized=False,
            ))
    return rows


def prepend_prompt(row: dict, ids: list[int]) -> dict:
    """The row with `ids` put before its prompt (a longer prompt, the generated tokens unchanged)."""
    n = len(ids)
    return {**row, "input_ids": ids + row["input_ids"], "loss_mask": [0] * n + row["loss_mask"],
            "token_class": [0] * n + row["token_class"], "advantage": [0.0] * n + row["advantage"],
            "behaviour_logprob": [None] * n + row["behaviour_logprob"], "turn_index": [-1] * n + row["turn_index"],
            "prompt_len": row["prompt_len"] + n}


EXPERT_TRACE = {
    "turns": [{
        "reasoning_segments": [
            {"text": "The question asks for a capital.", "explicit_call_preview": False},
            {"text": "I will look it up with the lookup tool.", "explicit_call_preview": False},
            {"text": 'The tool call would be {"name": "lookup"}.', "explicit_call_preview": True},
        ],
        "tool_call": {"name": "lookup", "arguments": {"key": "alpha"}},
        "observation": "alpha 7",
    }],
    "final_answer": "alpha 7",
}


def write_samples(out: Path, rows: list[dict], traces: dict[str, dict] | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA), out / "samples.parquet")
    tasks = sorted({r["task_id"] for r in rows})
    traces = traces or {}
    pq.write_table(pa.Table.from_pylist([
        dict(task_id=t, input=json.dumps([{"role": "user", "content": f"Find the capital of task {t}?"}]),
             reference=json.dumps("x"), reference_calls=None,
             expert_trace=json.dumps(traces[t]) if t in traces else None)
        for t in tasks], schema=TASK_SCHEMA), out / "tasks.parquet")
    return out


def is_close(a: float, b: float, tol: float = 1e-5) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def tiny_samples(root: Path, model_dir: Path, traces: bool = False, **kw) -> Path:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = make_rows(tok, **kw)
    return write_samples(root, rows, {r["task_id"]: EXPERT_TRACE for r in rows} if traces else None)


def make_trainer(cls, model_dir: Path, samples: Path, **cfg_kw):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harnessrl.trainer.config import TrainConfig
    from harnessrl.trainer.data import load_samples

    defaults = dict(samples=str(samples), model=str(model_dir), out=str(samples / "out"), steps=2, batch_size=8, lr=1e-5, report_to="none")
    extra = cfg_kw.pop("trainer_kwargs", {})
    cfg = TrainConfig(**{**defaults, **cfg_kw}).validate()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    return cls(model, cfg, load_samples(samples), tok, **extra)


def one_step(model_dir: Path, samples: Path, out: Path, **cfg_kw):
    """One optimizer step through TRL's own loop; returns (logged loss, gradients before the optimizer
    step, trainer). `cfg_kw`: TrainConfig fields (default batch 8, lr 1e-3)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from harnessrl.trainer.config import TrainConfig
    from harnessrl.trainer.data import load_samples
    from harnessrl.trainer.grpo import HarnessTrainer

    class Grads(TrainerCallback):
        grads: dict = {}

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            Grads.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    cfg = TrainConfig(**{**dict(samples=str(samples), model=str(model_dir), out=str(out), steps=1, batch_size=8, lr=1e-3,
                                report_to="none"), **cfg_kw}).validate()
    torch.manual_seed(0)
    tr = HarnessTrainer(AutoModelForCausalLM.from_pretrained(model_dir), cfg, load_samples(samples),
                        AutoTokenizer.from_pretrained(model_dir), trl_args=dict(max_grad_norm=0.0, disable_tqdm=True),
                        callbacks=[Grads()])
    tr.train()
    return tr.state.log_history[0]["loss"], Grads.grads, tr


def own_loss(trainer, batch: dict, old) -> float:
    """The trainer's objective on a fixed batch with logp_old fixed (the policy before training)."""
    import torch

    with torch.no_grad():
        return float(trainer.objective(trainer.model, {**batch, "old_per_token_logps": old})["loss"])


def start_logps(trainer, batch: dict):
    import torch

    with torch.no_grad():
        return trainer.policy_logps(trainer.model, batch)[0]


def session_rows(tok, tokens: int, n: int = 1, seed: int = 0) -> list[dict]:
    """`n` samples of a long coding-CLI session, each about `tokens` tokens, in the compiler's format: a
    system prompt with many tool schemas (a CLI's first prompt: ~40% of the tokens), then turns of an
    assistant tool call (trainable) and a tool result (not trainable) until the length is reached."""
    import random

    rng = random.Random(seed)
    words = "the file test read write edit run search grep list open path line function class error value return".split()

    def text(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(k))

    rows = []
    for e in range(n):
        tools = []
        while True:
            tools.append({"type": "function", "function": {"name": f"tool_{len(tools)}", "description": text(200),
                                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}})
            prompt_text = tok.apply_chat_template([{"role": "user", "content": "Fix the failing test."}], tools=tools,
                                                  add_generation_prompt=True, tokenize=False)
            prompt = tok(prompt_text, add_special_tokens=False)["input_ids"]
            if len(prompt) >= 0.4 * tokens:
                break
        ids, mask, classes = list(prompt), [0] * len(prompt), [0] * len(prompt)
        while len(ids) < tokens:
            call = tok(f'<think>\n{text(20)}\n</think>\n\n<tool_call>\n{{"name": "tool_{rng.randrange(len(tools))}", '
                       f'"arguments": {{"path": "{text(2)}"}}}}\n</tool_call><|im_end|>', add_special_tokens=False)["input_ids"]
            obs = tok(f"\n<|im_start|>user\n<tool_response>\n{text(150)}\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n",
                      add_special_tokens=False)["input_ids"]
            ids += call + obs
            mask += [1] * len(call) + [0] * len(obs)
            classes += [ACTION] * len(call) + [0] * len(obs)
        ids, mask, classes = ids[:tokens], mask[:tokens], classes[:tokens]
        adv = 1.0 if e % 2 == 0 else -1.0
        rows.append(dict(
            sample_id=f"s{e}/main/c0", rollout_id=f"s{e}", task_id="t0", group_id="t0", agent="main", session_id=None,
            input_ids=ids, loss_mask=mask, token_class=classes, advantage=[adv * m for m in mask],
            behaviour_logprob=[(-2.0 if m else None) for m in mask], turn_index=[-1] * len(prompt) + [0] * (len(ids) - len(prompt)),
            call_ids=["c0"], prompt_len=len(prompt), weight_version="v0", outcome_reward=max(adv, 0.0),
            reward_breakdown=json.dumps({"outcome": max(adv, 0.0), "advantage": "grpo"}), retokenized=False,
        ))
    return rows


def padded_sft_loss(model, batch: list[tuple[list[int], list[float]]], pad: int):
    """The warm start's loss by its definition (and its code before packing): Σ w·nll / Σ w over a
    right-padded batch, full logits everywhere."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    ids = torch.tensor([s + [pad] * (width - len(s)) for s, _ in batch])
    w = torch.tensor([ws + [0.0] * (width - len(ws)) for _, ws in batch])
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s, _ in batch])
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return (nll * w[:, 1:]).sum() / w[:, 1:].sum()
