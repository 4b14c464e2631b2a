"""The proxy on the embedded local backend (tiny model), driven by the openai SDK on a real
socket: plain, streaming, tools, multi-turn with tool results, prefix-consistent prompts."""

from __future__ import annotations

import math

import openai
import orjson
import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.proxy.local.backend import LocalBackend
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, unpack_ids, unpack_logprobs
from harnessrl.tiny_model import DEFAULT_TOOL

# the tool the tiny model is imprinted to call (see harnessrl.tiny_model)
TOOLS = [{"type": "function", "function": {"name": DEFAULT_TOOL, "description": "Look a word up.",
                                           "parameters": {"type": "object",
                                                          "properties": {"query": {"type": "string"}},
                                                          "required": ["query"]}}}]


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    b = LocalBackend(tiny_model_dir, seed=0)
    yield b
    b.close()


def _proxy(db: str, backend: LocalBackend, model_dir, prefix: bool | None = None):
    return run_proxy(ProxyConfig(db=db, backend="local", model=str(model_dir), port=0, prefix=prefix), backend=backend)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def _calls(db: str) -> list[Call]:
    engine, Session = open_db(db)
    with Session() as s:
        rows = list(s.scalars(select(Call).order_by(Call.seq)))
    engine.dispose()
    return rows


def test_plain_and_stream_record_the_same_tokens(backend, tiny_model_dir, db_target):
    messages = [{"role": "user", "content": "What is the capital of france?"}]
    with _proxy(db_target, backend, tiny_model_dir) as proxy:
        client = _client(proxy.url)
        plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=24, seed=7)
        chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=24, seed=7,
                                                     stream=True, stream_options={"include_usage": True}))
    streamed_text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    a, b = _calls(db_target)
    assert unpack_ids(a.prompt_ids).tolist() == backend.render(messages)
    assert (a.prompt_path, a.drift, a.weight_version) == ("render", None, backend.weight_version)
    # same seed, same prompt: the stream sampled the very same tokens
    assert a.completion_ids == b.completion_ids and a.completion_logprobs == b.completion_logprobs
    ids = unpack_ids(a.completion_ids).tolist()
    text_ids = ids[:-1] if ids[-1] in backend.eos_token_ids else ids
    assert backend.decode(text_ids) == plain.choices[0].message.content == a.response_text
    assert streamed_text == plain.choices[0].message.content == b.response_text
    lps = unpack_logprobs(a.completion_logprobs)
    assert len(lps) == len(ids) == a.completion_tokens and all(math.isfinite(v) and v <= 0 for v in lps)
    assert chunks[-1].usage.completion_tokens == len(ids)
    # the stream's record has the shape of the non-stream one
    assert b.stream and not a.stream
    assert set(a.response) == set(b.response) and set(a.response["choices"][0]) == set(b.response["choices"][0])
    assert a.response["choices"][0]["message"] == b.response["choices"][0]["message"]


def test_tools_and_tool_results_over_several_turns(backend, tiny_model_dir, tmp_path):
    db = str(tmp_path / "t.db")
    messages: list[dict] = [{"role": "user", "content": "What is the capital of france?"}]
    with _proxy(db, backend, tiny_model_dir) as proxy:
        client = _client(proxy.url)
        first = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, temperature=0,
                                               max_tokens=40)
        msg = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls" and msg.tool_calls
        assert msg.tool_calls[0].function.name == DEFAULT_TOOL
        assert "query" in orjson.loads(msg.tool_calls[0].function.arguments)
        messages.append(msg.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "Paris 42"})
        stream = list(client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, temperature=0,
                                                     max_tokens=40, stream=True))
        again = list(client.chat.completions.create(model="tiny", messages=messages[:1], tools=TOOLS, temperature=0,
                                                    max_tokens=40, stream=True))
    c1, c2, c3 = _calls(db)
    assert c1.tool_calls[0]["function"]["name"] == DEFAULT_TOOL and c1.finish_reason == "tool_calls"
    # the answer to the tool result: streamed as content, recorded as one prefix-consistent call
    assert c2.request["messages"][-1]["role"] == "tool" and c2.prefix_call_id == c1.id and c2.prompt_path == "prefix"
    assert stream[-1].choices[0].finish_reason == c2.finish_reason == "stop" and not c2.tool_calls
    assert "".join(ch.choices[0].delta.content or "" for ch in stream) == c2.response_text
    # the same first turn streamed: tool calls arrive at the end, recorded like the non-stream call
    streamed_calls = [tc for ch in again for tc in (ch.choices[0].delta.tool_calls or [])]
    assert [t.function.name for t in streamed_calls] == [DEFAULT_TOOL]
    assert again[-1].choices[0].finish_reason == "tool_calls"
    assert c3.completion_ids == c1.completion_ids and c3.tool_calls[0]["function"]["arguments"] == \
        c1.tool_calls[0]["function"]["arguments"]
    for c in (c1, c2, c3):
        ids = unpack_ids(c.completion_ids).tolist()
        assert len(unpack_logprobs(c.completion_logprobs)) == len(ids) and ids[-1] in backend.eos_token_ids


def _conversation(client: openai.OpenAI, turns: int, seed: int = 0) -> list[str]:
    messages: list[dict] = [{"role": "user", "content": "Search for the capital of spain, then answer."}]
    ids = []
    for turn in range(turns):
        raw = client.chat.completions.with_raw_response.create(model="tiny", messages=messages, tools=TOOLS,
                                                               max_tokens=48, seed=seed + turn, temperature=1.0)
        ids.append(raw.headers["x-harnessrl-call"])
        msg = raw.parse().choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": f"result {turn}: madrid"})
        if not msg.tool_calls:
            messages.append({"role": "user", "content": "Go on."})
    return ids


def test_four_turn_tool_conversation_is_prefix_consistent(backend, tiny_model_dir, db_target):
    with _proxy(db_target, backend, tiny_model_dir) as proxy:  # prefix mode is the local default
        ids = _conversation(_client(proxy.url), 4)
    calls = _calls(db_target)
    assert [c.id for c in calls] == ids
    assert calls[0].prompt_path == "render"
    for prev, cur in zip(calls, calls[1:]):
        exact = unpack_ids(prev.prompt_ids).tolist() + unpack_ids(prev.completion_ids).tolist()
        assert unpack_ids(cur.prompt_ids).tolist()[: len(exact)] == exact
        assert (cur.prompt_path, cur.prefix_call_id) == ("prefix", prev.id)
        # drift is what re-rendering would have given: recorded either way
        rendered = backend.render(cur.request["messages"], TOOLS)
        assert cur.drift == (rendered[: len(exact)] != exact)


def test_mode_off_renders_and_records_drift(backend, tiny_model_dir, tmp_path):
    db = str(tmp_path / "runs.db")  # SQLite only: the DB side runs on both DBs in the tests above
    # Sampled text is often tokenized differently from how the tokenizer would encode it (BPE
    # splits are not unique), so re-rendering a sampled turn drifts. Seeded, so the same
    # conversations, and the same drifts, every run.
    with _proxy(db, backend, tiny_model_dir, prefix=False) as proxy:
        conversations = [_conversation(_client(proxy.url), 4, seed=100 * k) for k in range(4)]
    by_id = {c.id: c for c in _calls(db)}
    drifts = []
    for ids in conversations:
        calls = [by_id[i] for i in ids]
        for prev, cur in zip(calls, calls[1:]):
            exact = unpack_ids(prev.prompt_ids).tolist() + unpack_ids(prev.completion_ids).tolist()
            prompt = unpack_ids(cur.prompt_ids).tolist()
            assert prompt == backend.render(cur.request["messages"], TOOLS)  # plain rendering
            assert (cur.prompt_path, cur.prefix_call_id) == ("render", prev.id)
            assert cur.drift == (prompt[: len(exact)] != exact)
            drifts.append(cur.drift)
    assert any(drifts) and not all(drifts)


def test_weight_push_reloads_and_later_calls_record_the_version(backend, tiny_model_dir, tmp_path):
    from harnessrl.client import HarnessRL
    from harnessrl.records import WeightVersion

    db = str(tmp_path / "w.db")
    with _proxy(db, backend, tiny_model_dir) as proxy:
        client = _client(proxy.url)
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert HarnessRL(proxy.url).push_weights(str(tiny_model_dir), version="step-1") == "step-1"
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    before, after = _calls(db)
    assert before.weight_version != "step-1" and after.weight_version == "step-1"
    engine, Session = open_db(db)
    with Session() as s:
        assert [(w.version, w.path) for w in s.scalars(select(WeightVersion))] == [("step-1", str(tiny_model_dir))]
    engine.dispose()


def test_backend_rejections_are_4xx_setup_problems_5xx_and_both_recorded(backend, tiny_model_dir, tmp_path):
    db = str(tmp_path / "runs.db")
    messages = [{"role": "user", "content": "hi"}]
    template = backend.tokenizer.chat_template
    with _proxy(db, backend, tiny_model_dir) as proxy:
        client = _client(proxy.url)
        for stream in (False, True):  # a stream is refused before its 200 too
            with pytest.raises(openai.BadRequestError) as long:
                out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10**6, stream=stream)
                list(out) if stream else None
            assert long.value.body["code"] == "context_length_exceeded"
        backend.tokenizer.chat_template = None  # a checkpoint served without a chat template
        try:
            with pytest.raises(openai.InternalServerError) as setup:
                client.chat.completions.create(model="tiny", messages=messages)
        finally:
            backend.tokenizer.chat_template = template
    assert (setup.value.status_code, setup.value.body["code"]) == (500, "no_chat_template")
    calls = _calls(db)
    assert [(c.status, c.error.split(":")[0]) for c in calls] == [("error", "400 invalid_request_error")] * 2 + [
        ("error", "500 server_error")]
