"""A weight push to the real `vllm serve` (the tier's session server, tests/vllm_server.py):
rollouts recorded through the proxy, compiled, one `harnessrl train` step pushed through the proxy
(drain, vLLM's `reload_weights` from the checkpoint directory, check, resume); the next calls
carry the new version and their log-probs are the pushed checkpoint's, no longer the base's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import openai
import pytest

from harnessrl.client import HarnessRL
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import unpack_ids, unpack_logprobs
from harnessrl.trainer.push import push_vllm
from test_vllm_serve import LOGPROB_TOL, QUESTION, calls, trainer_logprobs
from vllm_server import SERVED

pytestmark = pytest.mark.vllm


def harnessrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("harnessrl")), *args], capture_output=True, text=True,
                          timeout=600)


def record_rollouts(proxy_url: str, tasks=("paris", "oslo")) -> None:
    """Two rollouts a task, one rewarded 1 and one 0: a group with an advantage to train on."""
    with HarnessRL(proxy_url) as hrl:
        for task in tasks:
            for k in range(2):
                with hrl.rollout(task_id=task, group_id=task) as ro:
                    openai.OpenAI(base_url=ro.base_url("main"), api_key="x", max_retries=0).chat.completions.create(
                        model=SERVED, messages=[{"role": "user", "content": f"Tell me about {task}?"}],
                        max_tokens=12, temperature=1.0, seed=k)
                    ro.reward(float(k))


def probe(proxy_url: str) -> None:
    """One fixed-length sample of QUESTION, recorded."""
    openai.OpenAI(base_url=proxy_url + "/v1", api_key="x", max_retries=0).chat.completions.create(
        model=SERVED, messages=QUESTION, max_tokens=24, temperature=1.0, seed=5, extra_body={"ignore_eos": True})


def test_train_push_through_the_proxy_then_calls_are_the_new_weights(vllm_url, vllm_model_dir, tmp_path):
    db = str(tmp_path / "runs.db")
    ups = tmp_path / "upstreams.txt"
    ups.write_text(vllm_url + "\n")  # an upstreams file: the proxy drains and reloads it on a push
    try:
        with run_proxy(ProxyConfig(db=db, upstreams_file=str(ups), port=0)) as proxy:
            record_rollouts(proxy.url)
            probe(proxy.url)
            out = tmp_path / "compiled"
            r = harnessrl("compile", "--db", db, "--out", str(out), "--tokenizer", str(vllm_model_dir))
            assert r.returncode == 0, r.stderr[-2000:]
            r = harnessrl("train", str(out), "--model", str(vllm_model_dir), "--algo", "grpo", "--steps", "1",
                          "--batch-size", "4", "--lr", "1e-3", "--out", str(tmp_path / "ck"), "--weight-version", "round-1",
                          "--push", proxy.url)
            assert r.returncode == 0, r.stderr[-2000:]
            probe(proxy.url)
    finally:  # the session's server goes back to the base weights for the tier's other tests
        push_vllm(vllm_url, vllm_model_dir, "base", lora=False)
    rows = calls(db)
    before, after = [c for c in rows if c.rollout_id == "unassigned"]
    assert before.weight_version is None and after.weight_version == "round-1"
    new = tmp_path / "ck" / "round-1"
    for call, weights in ((before, vllm_model_dir), (after, new)):
        prompt, ids = unpack_ids(call.prompt_ids).tolist(), unpack_ids(call.completion_ids).tolist()
        diff = np.abs(unpack_logprobs(call.completion_logprobs) - trainer_logprobs(weights, prompt, ids)).max()
        assert diff < LOGPROB_TOL, (call.weight_version, diff)
    # the pushed weights moved the log-probs of the same tokens by far more than the tolerance
    prompt, ids = unpack_ids(after.prompt_ids).tolist(), unpack_ids(after.completion_ids).tolist()
    moved = np.abs(trainer_logprobs(vllm_model_dir, prompt, ids) - unpack_logprobs(after.completion_logprobs)).max()
    print(f"\nlog-prob change after the push: {moved:.3e}")
    assert moved > 20 * LOGPROB_TOL
