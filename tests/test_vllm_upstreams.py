"""Two real vLLM processes behind one proxy (the tier's session server and a second one): each
session sticks to one of them, and a rolling push drains and reloads them one at a time, after
which every call, on either, is the new weights' and records the new version."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from harnessrl.client import HarnessRL
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import unpack_ids, unpack_logprobs
from harnessrl.trainer.push import push_vllm
from test_vllm_serve import LOGPROB_TOL, calls, trainer_logprobs
from vllm_server import SERVED, vllm_serve

pytestmark = pytest.mark.vllm


def served(proxy_url: str) -> list[int]:
    return [u["served"] for u in httpx.get(proxy_url + "/ready", timeout=10).json()["upstreams"]]


def perturbed(base, out):
    """Other weights than the base's (seeded noise): what a push must make both servers serve."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def test_sticky_sessions_and_a_rolling_push_on_two_vllm(vllm_url, vllm_model_dir, tmp_path):
    new = perturbed(vllm_model_dir, tmp_path / "v2")
    db = str(tmp_path / "runs.db")
    with vllm_serve(vllm_model_dir, tmp_path / "second.log") as second:
        try:
            with run_proxy(ProxyConfig(db=db, upstreams=(vllm_url, second), port=0)) as proxy, \
                    HarnessRL(proxy.url) as hrl:
                moves = []
                for k in range(12):  # sessions on both servers (all on one: 2^-11 with even arcs)
                    before = served(proxy.url)
                    with hrl.rollout(task_id=f"t{k}") as ro:
                        c = openai.OpenAI(base_url=ro.base_url("main"), api_key="x", max_retries=0)
                        for _ in range(2):
                            c.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": f"Find {k}?"}],
                                                      max_tokens=4)
                    moves.append([b - a for a, b in zip(before, served(proxy.url))])
                report = httpx.post(proxy.url + "/harnessrl/weights", json={"path": str(new), "version": "v2"},
                                    timeout=600).json()
                with hrl.rollout(task_id="after") as ro:
                    after_id = ro.id
                    c = openai.OpenAI(base_url=ro.base_url("main"), api_key="x", max_retries=0)
                    c.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "Find paris?"}],
                                              max_tokens=16, temperature=1.0, extra_body={"ignore_eos": True})
                ready = httpx.get(proxy.url + "/ready", timeout=10).json()["upstreams"]
        finally:
            for url in (vllm_url, second):
                push_vllm(url, vllm_model_dir, "base", lora=False)
    assert all(sorted(m) == [0, 2] for m in moves), moves  # both calls of a rollout on one server
    assert {tuple(m) for m in moves} == {(2, 0), (0, 2)}, moves  # and both servers took sessions
    assert [u["url"] for u in report["upstreams"]] == [vllm_url, second]
    assert all(u["version"] == "v2" and u["drained"] for u in report["upstreams"])
    assert [u["version"] for u in ready] == ["v2", "v2"]
    (last,) = [c for c in calls(db) if c.rollout_id == after_id]
    assert last.weight_version == "v2"
    prompt, ids = unpack_ids(last.prompt_ids).tolist(), unpack_ids(last.completion_ids).tolist()
    assert np.abs(unpack_logprobs(last.completion_logprobs) - trainer_logprobs(new, prompt, ids)).max() < LOGPROB_TOL
