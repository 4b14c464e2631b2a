"""The real model on the real `vllm serve` (CPU build): SmolLM2-135M-Instruct, converted with its own
output layer (`harnessrl smollm2 --vllm`), served by `harnessrl vllm`; a call of the assistant
family with its tools recorded through the proxy, the tools in the recorded prompt and the recorded
log-probs the trainer's recompute; then new weights pushed into the running server, after which
the same tokens carry the new checkpoint's log-probs, the untied output layer's change included."""

from __future__ import annotations

import time

import numpy as np
import openai
import pytest
import torch
from transformers import AutoTokenizer

from harnessrl.harness_examples.assistant.tasks import TOOLS, generate
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import unpack_ids, unpack_logprobs
from harnessrl.trainer.push import push_proxy
from test_vllm_serve import calls, trainer_logprobs
from vllm_server import SERVED, vllm_serve

pytestmark = pytest.mark.vllm

# float32 on both sides; vLLM's CPU attention and the trainer's sum 30 layers in different orders
LOGPROB_TOL = 2e-3


def moved_checkpoint(base, out):
    """The base weights with the output layer and one MLP nudged: a push a reload of only the tied
    or only the layer weights would miss."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for w in (model.lm_head.weight, model.model.layers[0].mlp.down_proj.weight):
            w.add_(torch.randn(w.shape, generator=gen) * w.std() * 0.3)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def record_then_push(proxy_url: str, task, base, new) -> None:
    """A call with the family's tools (16 tokens), the moved weights pushed through the proxy, the same call again."""
    client = openai.OpenAI(base_url=proxy_url + "/v1", api_key="x", max_retries=0, timeout=300)

    def ask() -> None:
        client.chat.completions.create(model=SERVED, messages=task.messages(), tools=TOOLS, max_tokens=16,
                                       temperature=1.0, seed=1, extra_body={"ignore_eos": True})

    ask()
    push_proxy(proxy_url, moved_checkpoint(base, new), "moved")
    ask()


def test_served_by_vllm_tools_recorded_logprobs_match_then_a_push_moves_them(smollm2_vllm_dir, tmp_path):
    task = generate(0)[0][0]
    db, new = str(tmp_path / "runs.db"), tmp_path / "moved"
    ups = tmp_path / "upstreams.txt"  # an upstreams file: the proxy drains and reloads it on a push
    t0 = time.monotonic()
    with vllm_serve(smollm2_vllm_dir, tmp_path / "vllm.log") as url:
        print(f"\nvllm serve (SmolLM2) up in {time.monotonic() - t0:.1f} s")
        ups.write_text(url + "\n")
        with run_proxy(ProxyConfig(db=db, upstreams_file=str(ups), tokenizer=str(smollm2_vllm_dir), port=0)) as proxy:
            record_then_push(proxy.url, task, smollm2_vllm_dir, new)
    before, after = calls(db)
    assert before.status == after.status == "ok" and after.weight_version == "moved"
    prompt_text = AutoTokenizer.from_pretrained(smollm2_vllm_dir).decode(unpack_ids(before.prompt_ids).tolist())
    assert all(t["function"]["name"] in prompt_text for t in TOOLS)  # what the model saw held every tool
    for call, weights in ((before, smollm2_vllm_dir), (after, new)):
        prompt, ids = unpack_ids(call.prompt_ids).tolist(), unpack_ids(call.completion_ids).tolist()
        assert len(ids) == 16
        gap = np.abs(unpack_logprobs(call.completion_logprobs) - trainer_logprobs(weights, prompt, ids)).max()
        assert gap < LOGPROB_TOL, (call.weight_version, gap)
    prompt, ids = unpack_ids(after.prompt_ids).tolist(), unpack_ids(after.completion_ids).tolist()
    moved = np.abs(trainer_logprobs(smollm2_vllm_dir, prompt, ids) - unpack_logprobs(after.completion_logprobs)).max()
    print(f"log-prob change after the push: {moved:.3e}")
    assert moved > 20 * LOGPROB_TOL
