"""The request contract on the local backend (tiny model) and through the upstream routes, with
the openai SDK on a real socket: tool_choice and response_format enforced by constrained
decoding, real top_logprobs, developer messages, media parts, token ids and log-probs given
back when asked for, and the served model name; the Gemini surface's share of it with the
google-genai SDK; a subnormal top_p on every surface."""

from __future__ import annotations

import json
import math

import openai
import orjson
import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.proxy.local.backend import LocalBackend
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, unpack_ids, unpack_logprobs

ASK = [{"role": "user", "content": "What is the capital of france?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string",
                                                                                   "enum": ["paris", "oslo"]}},
                                                           "required": ["city"]}}}
LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                           "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                                          "required": ["query"]}}}


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    b = LocalBackend(tiny_model_dir, seed=0)
    yield b
    b.close()


@pytest.fixture(scope="module")
def proxy(backend, tiny_model_dir, tmp_path_factory):
    db = str(tmp_path_factory.mktemp("contract") / "c.db")
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0), backend=backend) as p:
        p.db = db
        yield p


@pytest.fixture
def client(proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)


def _call(db: str, call_id: str) -> Call:
    engine, Session = open_db(db)
    with Session() as s:
        row = s.scalars(select(Call).where(Call.id == call_id)).one()
    engine.dispose()
    return row


def _create(client, **kw):
    raw = client.chat.completions.with_raw_response.create(model="tiny", **kw)
    return raw.parse(), raw.headers["x-harnessrl-call"], orjson.loads(raw.content)


def test_named_tool_choice_forces_that_call_with_schema_valid_arguments(client, proxy):
    # unconstrained, the tiny model calls `lookup` (the tool it was trained on) or answers in text
    free, _, _ = _create(client, messages=ASK, tools=[LOOKUP, WEATHER], temperature=0, max_tokens=40)
    assert not free.choices[0].message.tool_calls or free.choices[0].message.tool_calls[0].function.name != "get_weather"
    out, cid, _ = _create(client, messages=ASK, tools=[LOOKUP, WEATHER], temperature=0, max_tokens=40,
                          tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (tc,) = out.choices[0].message.tool_calls
    assert tc.function.name == "get_weather" and json.loads(tc.function.arguments)["city"] in ("paris", "oslo")
    assert out.choices[0].finish_reason == "tool_calls"
    row = _call(proxy.db, cid)
    lps = unpack_logprobs(row.completion_logprobs)
    assert len(lps) == row.completion_tokens and all(math.isfinite(v) and v <= 0 for v in lps)


def test_required_tool_choice_forces_a_tool_call_when_sampling(client):
    for seed in range(3):
        out, _, _ = _create(client, messages=[{"role": "user", "content": "hello there"}], tools=[WEATHER],
                            tool_choice="required", max_tokens=40, seed=seed)
        assert out.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_response_format_json_schema_is_enforced(client):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"]}
    for seed in range(2):
        out, _, _ = _create(client, messages=ASK, max_tokens=30, seed=seed,
                            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
        assert json.loads(out.choices[0].message.content)["answer"] in ("yes", "no")
    with pytest.raises(openai.BadRequestError) as err:
        _create(client, messages=ASK, max_tokens=3, response_format={"type": "xml"})
    assert err.value.body["param"] == "response_format"


def test_tool_choice_none_hides_the_tools(client, proxy, backend):
    _, cid, _ = _create(client, messages=ASK, tools=[LOOKUP], tool_choice="none", max_tokens=4, temperature=0)
    assert unpack_ids(_call(proxy.db, cid).prompt_ids).tolist() == backend.render(ASK)
    with pytest.raises(openai.BadRequestError) as err:
        _create(client, messages=ASK, tools=[LOOKUP], max_tokens=3,
                tool_choice={"type": "function", "function": {"name": "nope"}})
    assert err.value.body["param"] == "tool_choice"


def test_top_logprobs_are_real_alternatives(client, proxy):
    out, cid, _ = _create(client, messages=ASK, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
    content = out.choices[0].logprobs.content
    row = _call(proxy.db, cid)
    recorded = unpack_logprobs(row.completion_logprobs)
    assert len(content) == row.completion_tokens
    for tok, lp in zip(content, recorded):
        alts = [a.logprob for a in tok.top_logprobs]
        assert len(alts) == 3 and alts == sorted(alts, reverse=True)
        # greedy: the chosen token is the most likely one
        assert math.isclose(tok.logprob, lp, rel_tol=1e-5) and math.isclose(alts[0], lp, rel_tol=1e-5)
        assert tok.top_logprobs[0].token == tok.token
    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, max_tokens=5, temperature=0,
                                                 logprobs=True, top_logprobs=2, stream=True))
    streamed = [t for c in chunks for ch in c.choices if ch.logprobs for t in ch.logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert all(len(t.top_logprobs) == 2 for t in streamed)


def test_developer_message_reaches_the_prompt(client, proxy, backend):
    msgs = [{"role": "developer", "content": "Answer in French."}, *ASK]
    _, cid, _ = _create(client, messages=msgs, max_tokens=3, temperature=0)
    prompt = backend.decode(unpack_ids(_call(proxy.db, cid).prompt_ids).tolist())
    assert "Answer in French." in prompt
    assert prompt == backend.decode(backend.render([{"role": "system", "content": "Answer in French."}, *ASK]))


@pytest.mark.parametrize("part", [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                  {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}])
def test_media_part_to_a_text_only_model_is_a_400(client, part):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]
    with pytest.raises(openai.BadRequestError) as err:
        _create(client, messages=msgs, max_tokens=3)
    assert err.value.body["param"] == "messages[0].content[1]" and part["type"] in err.value.body["message"]


def test_token_ids_and_logprobs_come_back_when_asked(client, proxy):
    _, cid, body = _create(client, messages=ASK, max_tokens=5, extra_body={"return_token_ids": True})
    row = _call(proxy.db, cid)
    assert body["prompt_token_ids"] == unpack_ids(row.prompt_ids).tolist()
    assert body["choices"][0]["token_ids"] == unpack_ids(row.completion_ids).tolist()
    # recorded once, in the id columns: the stored response is the harness's less the id fields
    assert row.response == {**{k: v for k, v in body.items() if k != "prompt_token_ids"},
                            "choices": [{k: v for k, v in body["choices"][0].items() if k != "token_ids"}]}
    raw = client.completions.with_raw_response.create(model="tiny", prompt="The capital", max_tokens=3,
                                                      extra_body={"return_token_ids": True})
    choice, row = orjson.loads(raw.content)["choices"][0], _call(proxy.db, raw.headers["x-harnessrl-call"])
    assert choice["prompt_token_ids"] == unpack_ids(row.prompt_ids).tolist()
    assert choice["token_ids"] == unpack_ids(row.completion_ids).tolist()
    assert set(choice) - set(row.response["choices"][0]) == {"prompt_token_ids", "token_ids"}
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=ASK, max_tokens=5, stream=True,
                                                            seed=1, extra_body={"return_token_ids": True})
    chunks = list(raw.parse())
    row = _call(proxy.db, raw.headers["x-harnessrl-call"])
    assert (chunks[0].model_extra or {})["prompt_token_ids"] == unpack_ids(row.prompt_ids).tolist()
    streamed = [t for c in chunks for ch in c.choices for t in (ch.model_extra or {}).get("token_ids") or []]
    assert streamed == unpack_ids(row.completion_ids).tolist()
    # Completions streamed with logprobs: every chunk carries its token's log-prob
    text = list(client.completions.create(model="tiny", prompt="The capital", max_tokens=4, logprobs=1,
                                          stream=True, temperature=0))
    lps = [v for c in text for ch in c.choices if ch.logprobs for v in ch.logprobs.token_logprobs]
    assert len(lps) == 4 and all(v <= 0 for v in lps)


def test_served_model_name_is_the_directory_name_and_the_path_still_works(client, proxy, tiny_model_dir):
    assert [m.id for m in client.models.list()] == [tiny_model_dir.name]
    for name in (tiny_model_dir.name, str(tiny_model_dir)):
        raw = client.chat.completions.with_raw_response.create(model=name, messages=ASK, max_tokens=2)
        assert raw.parse().model == name
        # the record names the checkpoint that served it, so compile finds its tokenizer
        assert _call(proxy.db, raw.headers["x-harnessrl-call"]).model == str(tiny_model_dir.resolve())


@pytest.mark.parametrize("prefix", [False, True], ids=["passthrough", "token-route"])
def test_upstream_gives_token_ids_back_when_asked(upstream, tokenizer_dir, tmp_path, prefix):
    db = str(tmp_path / "u.db")
    cfg = ProxyConfig(db=db, upstream=upstream, port=0, prefix=prefix, tokenizer=str(tokenizer_dir) if prefix else None)
    with run_proxy(cfg) as p:
        c = openai.OpenAI(base_url=p.url + "/v1", api_key="unused", max_retries=0)
        raw = c.chat.completions.with_raw_response.create(model="m", messages=ASK, extra_body={"return_token_ids": True})
        body = orjson.loads(raw.content)
        plain = orjson.loads(c.chat.completions.with_raw_response.create(model="m", messages=ASK).content)
    row = _call(db, raw.headers["x-harnessrl-call"])
    assert body["prompt_token_ids"] == unpack_ids(row.prompt_ids).tolist()
    assert body["choices"][0]["token_ids"] == unpack_ids(row.completion_ids).tolist()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]  # only when asked
    # the recorded response is the harness's but for the ids, which the id columns hold once
    del body["prompt_token_ids"], body["choices"][0]["token_ids"]
    assert row.response == body


_SURFACE_BODIES = {
    "/v1/chat/completions": {"model": "tiny", "messages": ASK, "max_tokens": 4},
    "/v1/completions": {"model": "tiny", "prompt": "The capital", "max_tokens": 4},
    "/v1/responses": {"model": "tiny", "input": ASK[0]["content"], "max_output_tokens": 4},
    "/v1/messages": {"model": "tiny", "messages": ASK, "max_tokens": 4},
    "/v1beta/models/tiny:generateContent": {"contents": [{"role": "user", "parts": [{"text": ASK[0]["content"]}]}],
                                            "generationConfig": {"maxOutputTokens": 4}},
}


def _sampling(path: str, body: dict, **values) -> dict:
    if path.startswith("/v1beta"):
        names = {"top_p": "topP", "temperature": "temperature"}
        return {**body, "generationConfig": {**body["generationConfig"], **{names[k]: v for k, v in values.items()}}}
    return {**body, **values}


@pytest.mark.parametrize("path", list(_SURFACE_BODIES))
def test_a_subnormal_top_p_samples_the_most_likely_token(proxy, path):
    """top_p 1e-320 (a fuzz finding: it was a 500, the sampler's "probability tensor contains
    inf/nan") keeps only the most likely token, as any top_p small enough does: greedy."""
    import httpx

    body = _SURFACE_BODIES[path]
    ids = []
    for values in ({"temperature": 0}, {"temperature": 1, "top_p": 1e-320}):
        r = httpx.post(proxy.url + path, json=_sampling(path, body, **values), timeout=60)
        assert r.status_code == 200, r.text
        ids.append(unpack_ids(_call(proxy.db, r.headers["x-harnessrl-call"]).completion_ids).tolist())
    assert ids[0] == ids[1] and ids[0]


def test_gemini_generation_config_and_tool_config_are_the_request_contract(proxy):
    """The same contract through the Gemini surface, with the google-genai SDK: ANY with one
    allowed function forces it, responseSchema (Gemini's dialect) is enforced, log-probs are the
    recorded ones with real alternatives."""
    from google import genai
    from google.genai import types

    c = genai.Client(api_key="unused", http_options=types.HttpOptions(
        base_url=proxy.url, retry_options=types.HttpRetryOptions(attempts=1)))
    tools = [types.Tool(function_declarations=[
        types.FunctionDeclaration(name=t["function"]["name"], description=t["function"]["description"],
                                  parameters_json_schema=t["function"]["parameters"]) for t in (LOOKUP, WEATHER)])]
    forced = types.ToolConfig(function_calling_config=types.FunctionCallingConfig(
        mode="ANY", allowed_function_names=["get_weather"]))
    r = c.models.generate_content(model="tiny", contents=ASK[0]["content"], config=types.GenerateContentConfig(
        tools=tools, tool_config=forced, temperature=0, max_output_tokens=40))
    (call,) = r.function_calls
    assert call.name == "get_weather" and call.args["city"] in ("paris", "oslo")
    schema = types.Schema(type="OBJECT", properties={"answer": types.Schema(type="STRING", enum=["yes", "no"])},
                          required=["answer"])
    for seed in range(2):
        r = c.models.generate_content(model="tiny", contents=ASK[0]["content"], config=types.GenerateContentConfig(
            response_mime_type="application/json", response_schema=schema, seed=seed, max_output_tokens=30))
        assert json.loads(r.text)["answer"] in ("yes", "no")
    r = c.models.generate_content(model="tiny", contents=ASK[0]["content"], config=types.GenerateContentConfig(
        temperature=0, max_output_tokens=5, response_logprobs=True, logprobs=3))
    result = r.candidates[0].logprobs_result
    recorded = unpack_logprobs(_call(proxy.db, r.response_id).completion_logprobs)
    assert len(result.chosen_candidates) == len(recorded) == 5
    for chosen, top, lp in zip(result.chosen_candidates, result.top_candidates, recorded):
        assert math.isclose(chosen.log_probability, lp, rel_tol=1e-5) and len(top.candidates) == 3
        assert top.candidates[0].token == chosen.token  # greedy: the chosen token is the most likely
