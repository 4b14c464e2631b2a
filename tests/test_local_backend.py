"""The embedded backend on the real tiny model: rendering, sampling log-probs (checked against a
plain full forward pass), streaming, stop conditions, seeds, concurrency and weight reload."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from pathlib import Path

import pytest
import torch

from harnessrl.errors import UserError
from harnessrl.proxy.routes.token_backend import Completion, SamplingParams, TokenDelta
from harnessrl.proxy.errors import BackendRejected
from harnessrl.proxy.local.backend import LocalBackend
from harnessrl.proxy.routes.hermes_tools import parse_hermes
from harnessrl.tiny_model import DEFAULT_TOOL

LOOKUP = {"type": "function", "function": {
    "name": DEFAULT_TOOL, "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
QUESTION = [{"role": "user", "content": "What is the capital of france?"}]


@pytest.fixture(scope="module")
def backend(tiny_model_dir) -> LocalBackend:
    b = LocalBackend(tiny_model_dir, seed=0)
    yield b
    b.close()


@pytest.fixture(scope="module")
def prompt(backend) -> list[int]:
    return backend.render(QUESTION, tools=[LOOKUP])


def gen(backend: LocalBackend, prompt: list[int], **kw) -> Completion:
    return asyncio.run(backend.generate(prompt, SamplingParams(**kw)))


def collect(backend: LocalBackend, prompt: list[int], **kw) -> list[TokenDelta | Completion]:
    async def run():
        return [item async for item in backend.stream(prompt, SamplingParams(**kw))]
    return asyncio.run(run())


def reference_logprobs(model, prompt: list[int], ids: list[int], temperature: float, top_p: float) -> list[float]:
    """Log-probs of `ids` from one full forward pass (no cache), processed the vLLM way:
    logits / T, keep the most likely tokens until their mass reaches top_p, renormalise."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1: -1].float()
    out = []
    for row, tok in zip(logits, ids):
        row = row / temperature
        probs = torch.softmax(row, -1)
        order = torch.argsort(probs, descending=True)
        mass_before = torch.cumsum(probs[order], -1) - probs[order]
        row[order[mass_before >= top_p]] = -math.inf
        out.append(float(torch.log_softmax(row, -1)[tok]))
    return out


def test_render_is_the_tokenizers_chat_template(backend, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = backend.render(QUESTION, tools=[LOOKUP])
    text = tok.apply_chat_template(QUESTION, tools=[LOOKUP], add_generation_prompt=True, tokenize=False)
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert all(type(i) is int for i in ids)
    assert text.endswith("<|im_start|>assistant\n") and '"name": "lookup"' in text
    assert backend.render(QUESTION, add_generation_prompt=False) == tok(
        tok.apply_chat_template(QUESTION, tokenize=False), add_special_tokens=False)["input_ids"]


def test_generate_ids_text_and_logprobs(backend, prompt):
    c = gen(backend, prompt, max_tokens=40, temperature=1.0, seed=3)
    assert c.prompt_ids == prompt and c.weight_version == "base"
    assert len(c.logprobs) == len(c.completion_ids) >= 1
    assert all(math.isfinite(lp) and lp <= 0 for lp in c.logprobs)
    if c.finish_reason == "stop":
        assert c.completion_ids[-1] in backend.eos_token_ids
        assert backend.decode(c.completion_ids[:-1]) == c.text
    else:
        assert c.finish_reason == "length" and len(c.completion_ids) == 40
        assert backend.decode(c.completion_ids) == c.text
    assert not any(t in backend.eos_token_ids for t in c.completion_ids[:-1])


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (1.5, 0.5)])
def test_logprobs_match_a_full_forward_pass(backend, prompt, temperature, top_p):
    c = gen(backend, prompt, max_tokens=24, temperature=temperature, top_p=top_p, seed=11)
    ref = reference_logprobs(backend._model, prompt, c.completion_ids, temperature, top_p)
    assert c.logprobs == pytest.approx(ref, abs=1e-4)


def test_greedy_logprob_is_untempered_and_top_p_tiny_is_greedy(backend, prompt):
    greedy = gen(backend, prompt, max_tokens=12, temperature=0.0)
    ref = reference_logprobs(backend._model, prompt, greedy.completion_ids, 1.0, 1.0)
    assert greedy.logprobs == pytest.approx(ref, abs=1e-4)
    # top_p = 1e-6 keeps only the most likely token: its processed probability is 1, log-prob 0
    narrow = gen(backend, prompt, max_tokens=12, temperature=1.0, top_p=1e-6, seed=5)
    assert narrow.completion_ids == greedy.completion_ids
    assert narrow.logprobs == pytest.approx([0.0] * len(narrow.logprobs), abs=1e-6)


def test_seeds(backend, prompt):
    a = gen(backend, prompt, max_tokens=16, temperature=1.2, seed=7)
    b = gen(backend, prompt, max_tokens=16, temperature=1.2, seed=7)
    assert (a.completion_ids, a.logprobs) == (b.completion_ids, b.logprobs)
    others = {tuple(gen(backend, prompt, max_tokens=16, temperature=1.2, seed=s).completion_ids) for s in range(8, 12)}
    assert len(others | {tuple(a.completion_ids)}) > 1
    # without a per-request seed, two backends seeded alike sample alike
    twin = LocalBackend(backend._base_path, seed=0)
    fresh = LocalBackend(backend._base_path, seed=0)
    try:
        assert gen(twin, prompt, max_tokens=16).completion_ids == gen(fresh, prompt, max_tokens=16).completion_ids
    finally:
        twin.close()
        fresh.close()


def test_stream_matches_generate(backend, prompt):
    for kw in (dict(max_tokens=30, temperature=1.0, seed=21), dict(max_tokens=48, temperature=4.0, seed=22)):
        items = collect(backend, prompt, **kw)
        *deltas, final = items
        assert isinstance(final, Completion) and all(isinstance(d, TokenDelta) for d in deltas)
        assert [d.token_id for d in deltas] == final.completion_ids
        assert [d.logprob for d in deltas] == final.logprobs
        assert "".join(d.text for d in deltas) == final.text
        same = gen(backend, prompt, **kw)
        assert (same.completion_ids, same.logprobs, same.text) == (final.completion_ids, final.logprobs, final.text)


def test_stop_strings_and_length(backend, prompt):
    free = gen(backend, prompt, max_tokens=30, temperature=0.0)
    assert len(free.text) > 12
    stop = free.text[8:11]
    cut = gen(backend, prompt, max_tokens=30, temperature=0.0, stop=[stop, "never-seen"])
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.index(stop)]
    assert cut.completion_ids == free.completion_ids[: len(cut.completion_ids)]
    # the token that completed the stop string is kept in the ids (vLLM does the same)
    assert stop in backend.decode(cut.completion_ids)
    *deltas, final = collect(backend, prompt, max_tokens=30, temperature=0.0, stop=[stop])
    assert "".join(d.text for d in deltas) == final.text == cut.text
    short = gen(backend, prompt, max_tokens=3, temperature=0.0)
    assert short.finish_reason == "length" and short.completion_ids == free.completion_ids[:3]


def test_concurrent_requests_are_served_one_at_a_time(backend, prompt):
    async def many():
        return await asyncio.gather(*(backend.generate(prompt, SamplingParams(max_tokens=10, seed=s)) for s in range(6)))
    together = asyncio.run(many())
    alone = [gen(backend, prompt, max_tokens=10, seed=s) for s in range(6)]
    assert [c.completion_ids for c in together] == [c.completion_ids for c in alone]


def test_imprinted_model_calls_the_given_tool_and_answers_the_result(backend, prompt):
    c = gen(backend, prompt, max_tokens=40, temperature=0.0)
    content, calls = parse_hermes(c.text)
    assert [call["function"]["name"] for call in calls] == [DEFAULT_TOOL], c.text
    assert "query" in json.loads(calls[0]["function"]["arguments"])
    assert c.finish_reason == "stop"
    history = QUESTION + [
        {"role": "assistant", "content": content, "tool_calls": [{**calls[0], "function": calls[0]["function"]}]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "Paris 42"},
    ]
    answer = gen(backend, backend.render(history, tools=[LOOKUP]), max_tokens=40, temperature=0.0)
    assert answer.finish_reason == "stop", answer.text
    assert parse_hermes(answer.text)[1] == [] and answer.text.strip()


def test_bad_setup_is_a_user_error_and_bad_requests_are_rejected_with_a_4xx(backend, prompt, tmp_path):
    with pytest.raises(UserError, match="not a model directory"):
        LocalBackend(tmp_path / "missing")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError):
        LocalBackend(tmp_path)
    for params in (SamplingParams(max_tokens=0), SamplingParams(top_p=0.0), SamplingParams(temperature=-1.0)):
        with pytest.raises(BackendRejected) as bad:
            gen(backend, prompt, **vars(params))
        assert bad.value.status == 400
    with pytest.raises(BackendRejected) as long:
        gen(backend, prompt, max_tokens=10**6)
    assert (long.value.status, long.value.code) == (400, "context_length_exceeded")
    with pytest.raises(BackendRejected, match="empty"):
        asyncio.run(backend.generate([], SamplingParams()))
    with pytest.raises(BackendRejected):
        asyncio.run(backend.generate([10**9], SamplingParams()))
    with pytest.raises(BackendRejected) as template:
        backend.render([{"role": "assistant", "content": None, "tool_calls": [{"x": 1}]}])
    assert (template.value.status, template.value.code) == (400, "template_error")
    with pytest.raises(UserError, match="neither"):
        backend.reload(str(tmp_path / "nowhere"))


def _perturbed_checkpoint(src: Path, dst: Path, seed: int, version: str | None = None) -> Path:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    model.save_pretrained(dst)
    if version:
        (dst / "harnessrl_version.txt").write_text(version + "\n")
    return dst


def test_reload_full_checkpoint_and_lora_while_serving(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    b = LocalBackend(tiny_model_dir, seed=0)
    try:
        p = b.render(QUESTION, tools=[LOOKUP])
        base = gen(b, p, max_tokens=20, temperature=1.0, seed=1)
        assert base.weight_version == b.weight_version == "base"

        ckpt = _perturbed_checkpoint(tiny_model_dir, tmp_path / "step-1", seed=1, version="v1")
        assert b.reload(str(ckpt)) == "v1" == b.weight_version
        after = gen(b, p, max_tokens=20, temperature=1.0, seed=1)
        assert after.weight_version == "v1" and after.logprobs != base.logprobs
        assert after.logprobs == pytest.approx(reference_logprobs(
            AutoModelForCausalLM.from_pretrained(ckpt), p, after.completion_ids, 1.0, 1.0), abs=1e-4)

        # A reload issued mid-stream lands after the running completion, which keeps its version.
        ckpt2 = _perturbed_checkpoint(tiny_model_dir, tmp_path / "step-2", seed=2)

        async def stream_and_reload():
            items, done = [], None
            async for item in b.stream(p, SamplingParams(max_tokens=30, temperature=1.0, seed=1)):
                items.append(item)
                if len(items) == 2:
                    done = threading.Thread(target=lambda: b.reload(str(ckpt2), version="v2"))
                    done.start()
            done.join()
            return items[-1]
        during = asyncio.run(stream_and_reload())
        assert during.weight_version == "v1"
        assert during.completion_ids[:20] == after.completion_ids[: min(20, len(during.completion_ids))]
        assert b.weight_version == "v2" and gen(b, p, max_tokens=5, seed=1).weight_version == "v2"

        # A LoRA adapter is merged into the base weights (not into the last reload).
        base_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        lora = get_peft_model(base_model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
        lora.save_pretrained(tmp_path / "adapter-3")
        assert b.reload(str(tmp_path / "adapter-3")) == "adapter-3"
        with_lora = gen(b, p, max_tokens=12, temperature=1.0, seed=1)
        merged = lora.merge_and_unload()
        assert with_lora.logprobs == pytest.approx(
            reference_logprobs(merged, p, with_lora.completion_ids, 1.0, 1.0), abs=1e-4)
        assert with_lora.logprobs != base.logprobs[: len(with_lora.logprobs)]

        # Back to the base directory: the base outputs again.
        b.reload(str(tiny_model_dir), version="base-again")
        again = gen(b, p, max_tokens=20, temperature=1.0, seed=1)
        assert (again.completion_ids, again.logprobs) == (base.completion_ids, base.logprobs)
    finally:
        b.close()
