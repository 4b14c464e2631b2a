"""n > 1 and best_of: n samples of one prompt, each its own call record, returned as n choices;
on the local backend (tiny model) and through the upstream routes (vLLM stand-in), plain and
streamed, driven by the openai SDK on a real socket; compile sees the samples as branches."""

from __future__ import annotations

import json

import openai
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from harnessrl.app.cli import app as cli_app
from harnessrl.client import HarnessRL
from harnessrl.db import open_db
from harnessrl.proxy.local.backend import LocalBackend
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, unpack_ids, unpack_logprobs

MESSAGES = [{"role": "user", "content": "What is the capital of france?"}]


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    b = LocalBackend(tiny_model_dir, seed=0)
    yield b
    b.close()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def _calls(db: str) -> list[Call]:
    engine, Session = open_db(db)
    with Session() as s:
        rows = list(s.scalars(select(Call).order_by(Call.seq)))
    engine.dispose()
    return rows


def _local(db, backend, model_dir):
    return run_proxy(ProxyConfig(db=db, backend="local", model=str(model_dir), port=0), backend=backend)


def test_local_n3_plain_and_streamed_are_three_recorded_siblings(backend, tiny_model_dir, tmp_path):
    db = str(tmp_path / "n.db")
    with _local(db, backend, tiny_model_dir) as proxy:
        client = _client(proxy.url)
        raw = client.chat.completions.with_raw_response.create(model="tiny", messages=MESSAGES, n=3, max_tokens=6,
                                                                seed=11)
        plain = raw.parse()
        chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, n=3, max_tokens=6, seed=11,
                                                     stream=True, stream_options={"include_usage": True}))
    assert [c.index for c in plain.choices] == [0, 1, 2]
    ids = raw.headers["x-harnessrl-calls"].split(",")
    assert len(set(ids)) == 3 and raw.headers["x-harnessrl-call"] == ids[0]
    rows = _calls(db)
    assert len(rows) == 6 and all(r.status == "ok" for r in rows)
    first, second = rows[:3], rows[3:]
    assert [r.id for r in first] == ids
    # one prompt, three samples: the same prompt ids, each its own completion and log-probs
    prompt = unpack_ids(first[0].prompt_ids).tolist()
    assert prompt == backend.render(MESSAGES)
    assert all(unpack_ids(r.prompt_ids).tolist() == prompt for r in rows)
    assert [r.response_text for r in first] == [c.message.content for c in plain.choices]
    assert len({r.completion_ids for r in first}) > 1  # seeds 11, 12, 13: distinct samples
    assert all(len(unpack_logprobs(r.completion_logprobs)) == r.completion_tokens for r in rows)
    assert plain.usage.completion_tokens == sum(r.completion_tokens for r in first)
    assert plain.usage.prompt_tokens == len(prompt)
    # streamed: every chunk names its choice; each choice's text is its record's; one usage chunk
    texts = {0: "", 1: "", 2: ""}
    finishes = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert sorted(finishes) == [0, 1, 2]
    assert [texts[i] for i in range(3)] == [r.response_text for r in second]
    # same seeds: the stream sampled what the plain call sampled
    assert [r.completion_ids for r in second] == [r.completion_ids for r in first]
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == sum(r.completion_tokens for r in second)


@pytest.mark.parametrize("prefix", [False, True], ids=["passthrough", "token-route"])
def test_upstream_n2_plain_and_streamed(upstream, tokenizer_dir, tmp_path, prefix):
    db = str(tmp_path / "u.db")
    cfg = ProxyConfig(db=db, upstream=upstream, port=0, prefix=prefix, tokenizer=str(tokenizer_dir) if prefix else None)
    with run_proxy(cfg) as proxy:
        client = _client(proxy.url)
        plain = client.chat.completions.create(model="m", messages=MESSAGES, n=2, max_tokens=8)
        chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, n=2, max_tokens=8, stream=True))
    assert [c.index for c in plain.choices] == [0, 1]
    rows = _calls(db)
    assert len(rows) == 4 and all(r.status == "ok" and r.completion_ids is not None for r in rows)
    assert [r.response_text for r in rows[:2]] == [c.message.content for c in plain.choices]
    texts = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
    assert [texts[0], texts[1]] == [r.response_text for r in rows[2:]]
    assert len({r.id for r in rows}) == 4


def test_best_of_returns_the_most_likely_and_records_the_rest_as_discarded(backend, tiny_model_dir, tmp_path):
    db = str(tmp_path / "b.db")
    with _local(db, backend, tiny_model_dir) as proxy:
        client = _client(proxy.url)
        raw = client.completions.with_raw_response.create(model="tiny", prompt="The capital of", max_tokens=5,
                                                          best_of=3, n=1, seed=3)
        out = raw.parse()
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="tiny", prompt="x", max_tokens=2, best_of=2, stream=True)
    assert err.value.body["param"] == "best_of"
    rows = _calls(db)
    refused = [r for r in rows if r.status == "error"]  # the refused call: recorded, never sampled
    assert len(refused) == 1 and refused[0].error.startswith("400") and refused[0].completion_ids is None
    rows = [r for r in rows if r.status != "error"]
    assert len(rows) == 3 and sorted(r.status for r in rows) == ["discarded", "discarded", "ok"]
    (kept,) = [r for r in rows if r.status == "ok"]
    assert raw.headers["x-harnessrl-call"] == kept.id and len(out.choices) == 1
    assert out.choices[0].text == kept.response_text
    score = {r.id: float(unpack_logprobs(r.completion_logprobs).sum()) for r in rows}
    assert score[kept.id] == max(score.values())
    assert out.usage.completion_tokens == sum(r.completion_tokens for r in rows)


@pytest.mark.parametrize("n", [0, 65, "2"])
def test_bad_n_is_a_400(backend, tiny_model_dir, tmp_path, n):
    with _local(str(tmp_path / "e.db"), backend, tiny_model_dir) as proxy:
        with pytest.raises(openai.BadRequestError) as err:
            _client(proxy.url).chat.completions.create(model="tiny", messages=MESSAGES, n=n, max_tokens=2)
    assert err.value.body["param"] == "n"


def test_compile_sees_the_n_samples_as_branches(backend, tiny_model_dir, tmp_path):
    db = str(tmp_path / "c.db")
    with _local(db, backend, tiny_model_dir) as proxy:
        with HarnessRL(proxy.url).rollout(task_id="t", group_id="g") as ro:
            client = openai.OpenAI(base_url=ro.base_url("solo"), api_key="unused", max_retries=0)
            first = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0)
            follow = MESSAGES + [first.choices[0].message.model_dump(exclude_none=True),
                                 {"role": "user", "content": "and then?"}]
            client.chat.completions.create(model="tiny", messages=follow, n=3, max_tokens=6, seed=5)
            ro.reward(1.0)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli_app, ["compile", "--db", db, "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = _calls(db)
    stats = json.loads((out / "stats.json").read_text())["totals"]
    # the three samples extend the first call: three root-to-leaf paths sharing it
    assert (stats["calls"], stats["samples"], stats["merges"]) == (4, 3, 3)
    samples = pq.read_table(out / "samples.parquet").to_pylist()
    assert sorted(s["call_ids"][-1] for s in samples) == sorted(r.id for r in rows[1:])
    assert all(s["call_ids"][0] == rows[0].id for s in samples)
    # the n siblings got one prompt: the first call's exact ids + the new turn
    assert len({r.prompt_ids for r in rows[1:]}) == 1 and rows[1].prompt_path == "prefix"
