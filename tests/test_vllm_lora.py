"""A LoRA push to the real `vllm serve` (a second server, started with runtime LoRA loading):
one `harnessrl train --lora` step pushed through the proxy (`/v1/load_lora_adapter`); vLLM serves
an adapter only to calls that name it, so the proxy's calls name it from then on, record its
version, and their log-probs are the base model's with the adapter merged."""

from __future__ import annotations

import numpy as np
import pytest

from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import unpack_ids, unpack_logprobs
from test_vllm_push import harnessrl, probe, record_rollouts
from test_vllm_serve import LOGPROB_TOL, calls, trainer_logprobs
from vllm_server import vllm_serve

pytestmark = pytest.mark.vllm


def merged(base, adapter, out):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).merge_and_unload().save_pretrained(out)
    return out


def test_lora_push_through_the_proxy_then_calls_name_the_adapter(vllm_model_dir, tmp_path):
    db = str(tmp_path / "runs.db")
    with vllm_serve(vllm_model_dir, tmp_path / "lora.log", lora=True) as url:
        ups = tmp_path / "upstreams.txt"
        ups.write_text(url + "\n")
        cfg = ProxyConfig(db=db, upstreams_file=str(ups), port=0, prefix=True, tokenizer=str(vllm_model_dir))
        with run_proxy(cfg) as proxy:
            record_rollouts(proxy.url)
            probe(proxy.url)
            out = tmp_path / "compiled"
            r = harnessrl("compile", "--db", db, "--out", str(out), "--tokenizer", str(vllm_model_dir))
            assert r.returncode == 0, r.stderr[-2000:]
            r = harnessrl("train", str(out), "--model", str(vllm_model_dir), "--algo", "grpo", "--steps", "1",
                          "--batch-size", "4", "--lr", "1e-2", "--lora", "--out", str(tmp_path / "ck"),
                          "--weight-version", "lora-1", "--push", proxy.url)
            assert r.returncode == 0, r.stderr[-2000:]
            probe(proxy.url)
    before, after = [c for c in calls(db) if c.rollout_id == "unassigned"]
    assert before.weight_version is None and after.weight_version == "lora-1"
    new = merged(vllm_model_dir, tmp_path / "ck" / "lora-1", tmp_path / "merged")
    prompt, ids = unpack_ids(after.prompt_ids).tolist(), unpack_ids(after.completion_ids).tolist()
    recorded = unpack_logprobs(after.completion_logprobs)
    assert np.abs(recorded - trainer_logprobs(new, prompt, ids)).max() < LOGPROB_TOL
    moved = np.abs(recorded - trainer_logprobs(vllm_model_dir, prompt, ids)).max()
    print(f"\nlog-prob change after the LoRA push: {moved:.3e}")
    assert moved > 20 * LOGPROB_TOL
