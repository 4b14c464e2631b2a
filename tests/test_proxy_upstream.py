"""The proxy in front of a vLLM upstream (the wire-format stand-in), driven by the openai SDK
on real sockets; records checked in SQLite and PostgreSQL."""

from __future__ import annotations

import math

import numpy as np
import openai
import orjson
import pytest
from sqlalchemy import select
from transformers import AutoTokenizer

from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, unpack_ids, unpack_logprobs
from vllm_standin import WEIGHT_VERSION

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "look a key up",
                                           "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                                                          "required": ["key"]}}}]


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def _calls(db: str) -> list[Call]:
    engine, Session = open_db(db)
    with Session() as s:
        rows = list(s.scalars(select(Call).order_by(Call.rollout_id, Call.seq)))
    engine.dispose()
    return rows


def _client(url: str, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, **kw)


def _standin_logprob(t: int) -> float:
    # the stand-in's "sampling" log-prob of token t (see vllm_standin.StandIn.reply)
    return -((t * 7919) % 1000) / 250.0 - 0.01


def test_chat_records_ids_and_returns_a_plain_openai_response(upstream, tok, db_target):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of the river?"}]
    with run_proxy(ProxyConfig(db=db_target, upstream=upstream, port=0)) as proxy:
        raw = _client(proxy.url).chat.completions.with_raw_response.create(model="m", messages=messages)
        call_id = raw.headers["x-harnessrl-call"]
        body = orjson.loads(raw.content)
    # none of the RL-only fields the proxy asked for reach the harness
    assert "prompt_token_ids" not in body
    assert set(body["choices"][0]) >= {"index", "message", "finish_reason"}
    assert "token_ids" not in body["choices"][0] and "weight_versions" not in body["choices"][0]
    assert body["choices"][0]["logprobs"] is None
    text = body["choices"][0]["message"]["content"]

    (call,) = _calls(db_target)
    assert call.id == call_id and call.rollout_id == "unassigned" and call.seq == 0 and call.status == "ok"
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert unpack_ids(call.prompt_ids).tolist() == tok.encode(rendered, add_special_tokens=False)
    ids = unpack_ids(call.completion_ids).tolist()
    assert ids[-1] == tok.eos_token_id and tok.decode(ids[:-1]) == text == call.response_text
    np.testing.assert_allclose(unpack_logprobs(call.completion_logprobs), [_standin_logprob(t) for t in ids], rtol=1e-6)
    assert call.weight_version == WEIGHT_VERSION
    assert (call.prompt_tokens, call.completion_tokens) == (body["usage"]["prompt_tokens"], len(ids))
    assert call.prompt_path == "render" and call.drift is None and call.latency_ms > 0
    assert call.request["messages"] == messages


def test_stream_records_the_same_as_non_stream(upstream, db_target):
    messages = [{"role": "user", "content": "Find alpha."}]
    with run_proxy(ProxyConfig(db=db_target, upstream=upstream, port=0)) as proxy:
        client = _client(proxy.url)
        full = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        chunks = list(client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True))
    # the harness sees a normal stream: no usage chunk it did not ask for, no RL fields
    assert all(ch.choices for ch in chunks)
    assert all("token_ids" not in ch.choices[0].model_extra for ch in chunks)
    streamed_calls = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert [tc.function.arguments for tc in streamed_calls] == [tc.function.arguments for tc in full.choices[0].message.tool_calls]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    plain, streamed = _calls(db_target)
    assert (plain.stream, streamed.stream) == (False, True)
    for field in ("prompt_ids", "completion_ids", "completion_logprobs", "weight_version", "finish_reason",
                  "prompt_tokens", "completion_tokens"):
        assert getattr(plain, field) == getattr(streamed, field), field
    assert len(plain.completion_ids) // 4 == len(plain.completion_logprobs) // 4 > 0
    assert streamed.response["object"] == "chat.completion"
    assert set(streamed.response["choices"][0]["message"]) >= {"role", "content", "tool_calls"}
    assert [t["function"]["name"] for t in streamed.tool_calls] == [t["function"]["name"] for t in plain.tool_calls] == ["lookup"]


def test_completions_and_models_pass_through(upstream, tok, tmp_path):
    db = str(tmp_path / "runs.db")  # SQLite only: the DB side runs on both DBs in the tests above
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        client = _client(proxy.url)
        out = client.completions.create(model="m", prompt="The river", max_tokens=4)
        stream_text = "".join(c.choices[0].text for c in client.completions.create(
            model="m", prompt="The river", max_tokens=4, stream=True) if c.choices)
        lp = client.completions.create(model="m", prompt="The river", max_tokens=4, logprobs=0)
        assert [m.id for m in client.models.list()] == ["standin"]
    assert out.choices[0].logprobs is None and out.choices[0].finish_reason == "length"
    assert len(lp.choices[0].logprobs.token_logprobs) == 4  # asked for: kept
    a, b, c = _calls(db)
    assert a.endpoint == "completions" and a.prompt_path == "raw"
    assert unpack_ids(a.prompt_ids).tolist() == tok.encode("The river")
    assert len(unpack_ids(a.completion_ids)) == 4 == len(unpack_logprobs(a.completion_logprobs))
    assert tok.decode(unpack_ids(a.completion_ids)) == out.choices[0].text == stream_text
    assert b.completion_ids == a.completion_ids and b.stream


def _tool_conversation(client: openai.OpenAI, turns: int) -> list[str]:
    """A harness loop: call, run the tool, send the result back; returns call ids."""
    messages: list[dict] = [{"role": "user", "content": "Look up alpha, then answer."}]
    ids = []
    for turn in range(turns):
        raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, tools=TOOLS)
        ids.append(raw.headers["x-harnessrl-call"])
        msg = raw.parse().choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": f'{{"value": "result {turn}"}}'})
        if not msg.tool_calls:
            messages.append({"role": "user", "content": "And again?"})
    return ids


def test_mode_off_detects_and_records_drift(upstream, tmp_path):
    db = str(tmp_path / "runs.db")  # SQLite only: the DB side runs on both DBs in the tests above
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        ids = _tool_conversation(_client(proxy.url), 3)
    calls = _calls(db)
    assert [c.id for c in calls] == ids and [c.seq for c in calls] == [0, 1, 2]
    assert calls[0].prefix_call_id is None and calls[0].drift is None
    for prev, cur in zip(calls, calls[1:]):
        # the stand-in samples non-canonical tokens: the upstream's re-rendering drifts
        exact = unpack_ids(prev.prompt_ids).tolist() + unpack_ids(prev.completion_ids).tolist()
        assert cur.prefix_call_id == prev.id and cur.prompt_path == "render"
        assert unpack_ids(cur.prompt_ids).tolist()[: len(exact)] != exact
        assert cur.drift is True


def test_prefix_mode_sends_exact_ids_to_the_upstream(upstream, tokenizer_dir, db_target):
    cfg = ProxyConfig(db=db_target, upstream=upstream, port=0, prefix=True, tokenizer=str(tokenizer_dir))
    with run_proxy(cfg) as proxy:
        client = _client(proxy.url)
        ids = _tool_conversation(client, 4)
        streamed = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                                       tools=TOOLS, stream=True))
    calls = _calls(db_target)
    assert [c.id for c in calls[:4]] == ids
    for prev, cur in zip(calls, calls[1:4]):
        exact = unpack_ids(prev.prompt_ids).tolist() + unpack_ids(prev.completion_ids).tolist()
        assert unpack_ids(cur.prompt_ids).tolist()[: len(exact)] == exact
        assert (cur.prompt_path, cur.prefix_call_id, cur.drift) == ("prefix", prev.id, True)
    assert calls[0].tool_calls and calls[0].tool_calls[0]["function"]["name"] == "lookup"
    assert calls[0].weight_version == WEIGHT_VERSION
    assert streamed[-1].choices[0].finish_reason == "tool_calls" and calls[4].stream


def test_upstream_failures_are_openai_errors_and_failed_records(upstream, db_target):
    with run_proxy(ProxyConfig(db=db_target, upstream=upstream, port=0, upstream_timeout=0.5)) as proxy:
        client = _client(proxy.url)
        msgs = [{"role": "user", "content": "x"}]
        with pytest.raises(openai.InternalServerError) as e500:
            client.chat.completions.create(model="fail-500", messages=msgs)
        with pytest.raises(openai.BadRequestError) as e400:
            client.chat.completions.create(model="fail-400", messages=msgs)
        with pytest.raises(openai.APIStatusError) as slow:
            client.chat.completions.create(model="slow", messages=msgs)
        with pytest.raises(openai.APIStatusError) as slow_stream:
            list(client.chat.completions.create(model="slow", messages=msgs, stream=True))
    assert e500.value.status_code == 500 and "injected upstream failure" in e500.value.message
    assert e400.value.status_code == 400
    assert slow.value.status_code == 504 and slow.value.body["type"] == "upstream_timeout"
    assert slow_stream.value.status_code == 504
    calls = _calls(db_target)
    assert [c.status for c in calls] == ["error"] * 4
    assert calls[0].error.startswith("500") and calls[2].error.startswith("504")
    assert calls[0].completion_ids is None


def test_unreachable_upstream_is_a_502(tmp_path):
    db = str(tmp_path / "runs.db")  # SQLite only: the DB side runs on both DBs in the tests above
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with run_proxy(ProxyConfig(db=db, upstream=dead, port=0)) as proxy:
        with pytest.raises(openai.APIStatusError) as err:
            _client(proxy.url).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 502 and err.value.body["code"] == "upstream_unreachable"
    (call,) = _calls(db)
    assert call.status == "error"


def test_requested_logprobs_reach_the_harness(upstream, tmp_path):
    db = str(tmp_path / "r.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        out = _client(proxy.url).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                         logprobs=True)
    lps = [c.logprob for c in out.choices[0].logprobs.content]
    (call,) = _calls(db)
    assert all(math.isfinite(v) for v in lps)
    np.testing.assert_allclose(unpack_logprobs(call.completion_logprobs), lps, rtol=1e-6)
