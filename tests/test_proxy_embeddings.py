"""/v1/embeddings through the proxy with the openai SDK's `client.embeddings.create`: mean-pooled
last hidden states on the local backend, passed through to an upstream (the vLLM stand-in);
recorded as non-trainable calls that compile counts and skips."""

from __future__ import annotations

import json

import numpy as np
import openai
import pytest
import torch
from sqlalchemy import select
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from harnessrl.app.cli import app as cli_app
from harnessrl.client import HarnessRL
from harnessrl.db import open_db
from harnessrl.proxy.local.backend import LocalBackend
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    b = LocalBackend(tiny_model_dir, seed=0)
    yield b
    b.close()


def _calls(db: str) -> list[Call]:
    engine, Session = open_db(db)
    with Session() as s:
        rows = list(s.scalars(select(Call).order_by(Call.seq)))
    engine.dispose()
    return rows


def _mean_pooled(model_dir, text: str) -> np.ndarray:
    """The reference: one input alone (no padding), mean of the last hidden states."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([tok.encode(text)]), output_hidden_states=True)
    return out.hidden_states[-1][0].mean(0).numpy()


def test_local_embeddings_are_mean_pooled_hidden_states(backend, tiny_model_dir, tmp_path):
    db = str(tmp_path / "e.db")
    texts = ["paris", "the capital of france is a long phrase"]  # different lengths: padding is masked
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0), backend=backend) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        got = client.embeddings.create(model="tiny", input=texts)  # the SDK asks for base64 and decodes it
        as_float = client.embeddings.create(model="tiny", input=texts[0], encoding_format="float")
        ids = backend.tokenizer.encode(texts[1])
        by_ids = client.embeddings.create(model="tiny", input=[ids], encoding_format="float")
        with pytest.raises(openai.BadRequestError) as err:
            client.embeddings.create(model="tiny", input=[])
    assert err.value.body["param"] == "input"
    hidden = backend._model.config.hidden_size
    assert [d.index for d in got.data] == [0, 1] and all(len(d.embedding) == hidden for d in got.data)
    for d, text in zip(got.data, texts):
        np.testing.assert_allclose(d.embedding, _mean_pooled(tiny_model_dir, text), rtol=1e-4, atol=1e-5)
    # batched (padded) and alone agree up to float noise
    np.testing.assert_allclose(as_float.data[0].embedding, got.data[0].embedding, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(by_ids.data[0].embedding, got.data[1].embedding, rtol=1e-4, atol=1e-6)
    n_tokens = sum(len(backend.tokenizer.encode(t)) for t in texts)
    assert got.usage.prompt_tokens == got.usage.total_tokens == n_tokens
    rows = _calls(db)
    assert [(r.endpoint, r.surface, r.status) for r in rows] == [("embeddings", "embeddings", "ok")] * 3 + [
        ("embeddings", "embeddings", "error")]  # the refused one (input: []) is recorded too
    rows = rows[:3]
    assert rows[0].prompt_tokens == n_tokens and rows[0].completion_ids is None
    # the record keeps the shape, not the vectors
    assert rows[0].response["data"] == [{"index": 0, "size": hidden}, {"index": 1, "size": hidden}]
    assert rows[1].response["data"] == [{"index": 0, "size": hidden}]


def test_upstream_embeddings_pass_through(upstream, tmp_path):
    db = str(tmp_path / "u.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/r/unassigned/a/rag/v1", api_key="unused", max_retries=0)
        got = client.embeddings.create(model="m", input=["alpha", "beta"], encoding_format="float")
    assert [len(d.embedding) for d in got.data] == [8, 8] and got.data[0].embedding != got.data[1].embedding
    (row,) = _calls(db)
    assert (row.endpoint, row.agent, row.status, row.prompt_tokens) == ("embeddings", "rag", "ok",
                                                                        got.usage.prompt_tokens)


def test_compile_counts_embedding_calls_and_skips_them(backend, tiny_model_dir, tmp_path):
    db = str(tmp_path / "c.db")
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0), backend=backend) as proxy:
        with HarnessRL(proxy.url).rollout(task_id="t", group_id="g") as ro:
            client = openai.OpenAI(base_url=ro.base_url("solo"), api_key="unused", max_retries=0)
            client.embeddings.create(model="tiny", input="what do I remember about paris?")
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "paris?"}],
                                           max_tokens=4, temperature=0)
            client.embeddings.create(model="tiny", input=["a", "b"])
            ro.reward(1.0)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli_app, ["compile", "--db", db, "--out", str(out)])
    assert res.exit_code == 0, res.output
    totals = json.loads((out / "stats.json").read_text())["totals"]
    assert (totals["embeddings"], totals["calls"], totals["samples"], totals["retokenized"]) == (2, 1, 1, 0)
    assert "embedding calls" in res.output
