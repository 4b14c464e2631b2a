"""What real vLLM refuses and the stand-in used to take, checked on the stand-in (which now
refuses it the same way): an unknown model name is vLLM's 404, so the `--prefix` token route must
send the name the upstream serves whatever the harness asked for (docs/vllm.md)."""

from __future__ import annotations

import httpx
import openai
import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call
from vllm_standin import create_app, run_standin


@pytest.fixture(scope="module")
def strict_upstream(tokenizer_dir):
    with run_standin(str(tokenizer_dir), create_app(str(tokenizer_dir), served=("tiny",))) as url:
        yield url


def test_standin_refuses_an_unknown_model_like_vllm(strict_upstream):
    r = httpx.post(strict_upstream + "/v1/completions", json={"model": "model", "prompt": [1, 2], "max_tokens": 1})
    assert r.status_code == 404
    assert r.json()["error"] == {"message": "The model `model` does not exist.", "type": "NotFoundError",
                                 "param": None, "code": 404}
    assert httpx.get(strict_upstream + "/v1/models").json()["data"][0]["id"] == "tiny"


def test_prefix_mode_sends_the_served_model_name(strict_upstream, tokenizer_dir, tmp_path):
    db = str(tmp_path / "runs.db")
    cfg = ProxyConfig(db=db, upstream=strict_upstream, port=0, prefix=True, tokenizer=str(tokenizer_dir))
    with run_proxy(cfg) as proxy:
        c = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        out = c.chat.completions.create(model="harness-model", messages=[{"role": "user", "content": "Hi"}])
        again = c.chat.completions.create(model="harness-model", messages=[{"role": "user", "content": "Hi"}],
                                          stream=True)
        assert list(again)
    assert out.choices[0].message.content is not None
    engine, Session = open_db(db)
    with Session() as s:
        rows = list(s.scalars(select(Call)))
    engine.dispose()
    assert [r.status for r in rows] == ["ok", "ok"] and all(r.prompt_path == "render" for r in rows)


def test_untie_embeddings_keeps_the_function_and_gives_lm_head_its_own_weights(tmp_path):
    """vLLM 0.32's reload leaves a tied output layer at its first weights (docs/vllm.md): an untied
    copy computes the same and carries `lm_head.weight` of its own."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from harnessrl.trainer.vllm import tied, untie_embeddings

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        before = AutoModelForCausalLM.from_pretrained(tmp_path)(ids).logits
    assert tied(tmp_path) and untie_embeddings(tmp_path) and not tied(tmp_path)
    assert not untie_embeddings(tmp_path)  # already untied: left alone
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" in f.keys()
    untied = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(untied(ids).logits, before)


def test_loop_upstream_that_does_not_answer_is_one_line(tmp_path):
    import subprocess
    import sys

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    r = subprocess.run([sys.executable, "-m", "harnessrl", "loop", "--harness", "lookup", "--model", str(tmp_path / "m"),
                        "--upstream", "http://127.0.0.1:9", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--upstream http://127.0.0.1:9: no model list there (ConnectError)" in r.stderr
