"""The Gemini API surface, driven by the google-genai SDK (and raw httpx for the JSON-array stream
and the `?key=` form) over a real socket, on the tiny model (local backend) behind a proxy with an
API key: generate, both stream forms, a function-calling round trip that merges into one
session, countTokens, the model list, Gemini-shaped errors recorded as failed calls, and the key
never at rest; and, in front of an upstream (the vLLM stand-in), thoughts a client drops coming
back through the thoughtSignature. The SDK's base URL is the proxy root or a rollout's base URL without /v1: it adds
/v1beta/models/{model}:{method} itself."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from google import genai
from google.genai import errors, types

from harnessrl.client import HarnessRL
from harnessrl.proxy.identity import rollout_tag
from harnessrl.records import unpack_ids
from surface_fixtures import assert_extends, assert_merged, assert_recorded, calls, compile_rollouts, serve_target

KEY = "gemini-sekret"
QUESTION = "What is the capital of france?"
LOOKUP = types.FunctionDeclaration(name="lookup", description="Look a word up.", parameters=types.Schema(
    type="OBJECT", properties={"query": types.Schema(type="STRING")}, required=["query"]))
CONFIG = types.GenerateContentConfig(system_instruction="Be brief.", tools=[types.Tool(function_declarations=[LOOKUP])],
                                     temperature=0, max_output_tokens=200)


@pytest.fixture(scope="module")
def target(tiny_model_dir, upstream, tokenizer_dir, tmp_path_factory):
    with serve_target("local", tmp_path_factory.mktemp("gemini"), tiny_model_dir, upstream, tokenizer_dir,
                      api_key=KEY) as t:
        yield t


def _client(base_url: str, key: str = KEY) -> genai.Client:
    return genai.Client(api_key=key, http_options=types.HttpOptions(
        base_url=base_url, retry_options=types.HttpRetryOptions(attempts=1)))


def _rollout(target):
    return HarnessRL(target.url, api_key=KEY).rollout()


def _text(r, thought: bool = False) -> str:
    """The answer's text (`thought`: its thought parts' instead)."""
    return "".join(p.text or "" for p in r.candidates[0].content.parts if bool(p.thought) == thought)


def test_function_call_round_trip_merges_into_one_session(target, tmp_path):
    with _rollout(target) as ro:
        # the rollout's base URL carries its key (/k/<tag>/r/…); the client's own key is ignored
        c = _client(ro.base_url("solo").removesuffix("/v1"), key="unused")
        contents = [types.Content(role="user", parts=[types.Part(text=QUESTION)])]
        r1 = c.models.generate_content(model="tiny", contents=contents, config=CONFIG)
        (call,) = r1.function_calls[:1]
        assert call.name == "lookup" and isinstance(call.args, dict) and call.id
        assert r1.candidates[0].finish_reason == "STOP" and r1.usage_metadata.prompt_token_count > 0
        contents += [r1.candidates[0].content, types.Content(role="user", parts=[types.Part(
            function_response=types.FunctionResponse(id=call.id, name="lookup", response={"output": "Paris 42"}))])]
        r2 = c.models.generate_content(model="tiny", contents=contents, config=CONFIG)
        assert r2.usage_metadata.prompt_token_count > r1.usage_metadata.prompt_token_count
    rows = calls(target.db, ro.id)
    assert [r.agent for r in rows] == ["solo", "solo"] and [r.id for r in rows] == [r1.response_id, r2.response_id]
    assert {r.surface for r in rows} == {"gemini"}
    first = rows[0].request
    assert first["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    # Gemini's schema dialect (OBJECT, STRING) as the JSON Schema the template shows
    assert first["tools"][0]["function"]["parameters"] == {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    assert first["temperature"] == 0 and first["max_tokens"] == 200
    surface = first["harnessrl_surface"]
    assert surface["api"] == "gemini" and surface["model"] == "tiny" and surface["method"] == "generateContent"
    assert rows[0].tool_calls[0]["id"] == call.id
    assert [m for m in rows[1].request["messages"] if m["role"] == "tool"] == [
        {"role": "tool", "tool_call_id": call.id, "content": "Paris 42"}]
    assert_extends(rows[0], rows[1])
    assert_merged(compile_rollouts(target, (ro.id,), tmp_path), rows, sessions=1)
    # neither the proxy's key nor the rollout's is anywhere at rest
    at_rest = b"".join(p.read_bytes() for p in Path(target.db).parent.glob(Path(target.db).name + "*"))
    assert KEY.encode() not in at_rest and rollout_tag(KEY, ro.id).encode() not in at_rest


def test_sse_stream_adds_up_to_the_answer(target):
    c = _client(target.url)
    contents = [types.Content(role="user", parts=[types.Part(text=QUESTION)])]
    config = types.GenerateContentConfig(temperature=0, max_output_tokens=30)
    plain = c.models.generate_content(model="tiny", contents=contents, config=config)
    chunks = list(c.models.generate_content_stream(model="tiny", contents=contents, config=config))
    assert len(chunks) > 1
    for thought in (False, True):  # (the tiny model leaves its think block open: all of it a thought)
        assert "".join(_text(ch, thought) for ch in chunks) == _text(plain, thought)
    assert _text(plain) + _text(plain, True) != ""
    last = chunks[-1]
    assert last.candidates[0].finish_reason == plain.candidates[0].finish_reason
    assert last.usage_metadata.prompt_token_count == plain.usage_metadata.prompt_token_count
    assert all(ch.candidates[0].finish_reason is None for ch in chunks[:-1])
    row = [r for r in calls(target.db) if r.id == last.response_id][0]
    assert row.stream and row.request["harnessrl_surface"]["alt"] == "sse"
    assert_recorded(row)


def test_json_array_stream_without_alt_sse(target):
    body = {"contents": [{"role": "user", "parts": [{"text": QUESTION}]}],
            "generationConfig": {"temperature": 0, "maxOutputTokens": 30}}
    # the key as ?key= (never recorded, taken out of the query string)
    url = f"{target.url}/v1beta/models/tiny:streamGenerateContent?key={KEY}"
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
        raw = r.read()
    items = json.loads(raw)
    assert isinstance(items, list) and len(items) > 1 and items[-1]["candidates"][0]["finishReason"] == "STOP"
    plain = httpx.post(f"{target.url}/v1beta/models/tiny:generateContent", json=body, headers={"x-goog-api-key": KEY},
                       timeout=60).json()
    text = "".join(p.get("text", "") for it in items for p in it["candidates"][0]["content"]["parts"])
    assert text == plain["candidates"][0]["content"]["parts"][0]["text"]
    assert items[-1]["usageMetadata"] == plain["usageMetadata"]


def test_count_tokens_is_the_prompt_a_call_gets(target):
    c = _client(target.url)
    contents = [types.Content(role="user", parts=[types.Part(text=QUESTION)])]
    n = c.models.count_tokens(model="tiny", contents=contents).total_tokens
    r = c.models.generate_content(model="tiny", contents=contents, config=types.GenerateContentConfig(
        max_output_tokens=2))
    row = [x for x in calls(target.db) if x.id == r.response_id][0]
    assert n == len(unpack_ids(row.prompt_ids)) == r.usage_metadata.prompt_token_count
    # a whole generateContentRequest: its system instruction and tools are in the count
    whole = {"generateContentRequest": {"model": "models/tiny", "contents": [{"parts": [{"text": QUESTION}]}],
                                        "systemInstruction": {"parts": [{"text": "Be brief."}]},
                                        "tools": [{"functionDeclarations": [LOOKUP.model_dump(exclude_none=True)]}]}}
    more = httpx.post(f"{target.url}/v1beta/models/tiny:countTokens", json=whole, headers={"x-goog-api-key": KEY})
    assert more.status_code == 200 and more.json()["totalTokens"] > n


def test_models_list_and_get(target, tiny_model_dir):
    c = _client(target.url)
    assert [m.name for m in c.models.list()] == [f"models/{tiny_model_dir.name}"]
    got = c.models.get(model="gemini-2.5-flash")
    assert got.name == "models/gemini-2.5-flash" and "generateContent" in got.supported_actions


@pytest.mark.parametrize("body, field", [
    ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"temprature": 0}}, "temprature"),
    ({"contents": [{"parts": [{"text": "x", "colour": 1}]}]}, "colour"),
    ({"contents": []}, "contents"),
    ({"contents": [{"role": "robot", "parts": [{"text": "x"}]}]}, "contents[0].role"),
    ({"contents": [{"parts": [{"text": "x"}]}, {"role": "model", "parts": [{"text": "pre"}]}]}, "contents[1].role"),
    ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"topP": 0}}, "generationConfig.topP"),
    ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"candidateCount": 2}},
     "generationConfig.candidateCount"),
    ({"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": [
        {"name": "f", "parameters": {"type": "WIDGET"}}]}]}, "tools[0].functionDeclarations[0].parameters.type"),
    ({"contents": [{"parts": [{"text": "x"}]}], "toolConfig": {"functionCallingConfig": {"mode": "SOMETIMES"}}},
     "toolConfig.functionCallingConfig.mode"),
    ({"contents": [{"parts": [{"text": "x"}]}], "cachedContent": "cachedContents/1"}, "cachedContent"),
])
def test_malformed_requests_get_gemini_shaped_400s_recorded_as_failed_calls(target, body, field):
    with _rollout(target) as ro:
        r = httpx.post(f"{target.url}/r/{ro.id}/a/solo/v1beta/models/tiny:generateContent", json=body,
                       headers={"x-goog-api-key": KEY})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["status"] == "INVALID_ARGUMENT" and field in err["message"]
    assert err["details"][0]["fieldViolations"][0]["field"].endswith(field)
    (row,) = calls(target.db, ro.id)
    assert row.status == "error" and row.surface == "gemini" and row.error.startswith("400")
    assert row.id == r.headers["x-harnessrl-call"]


def test_snake_case_fields_are_gemini_fields_too(target):
    body = {"contents": [{"role": "user", "parts": [{"text": QUESTION}]}],
            "system_instruction": {"parts": [{"text": "Be brief."}]},
            "generation_config": {"max_output_tokens": 3, "temperature": 0, "stop_sequences": ["\n\n"]}}
    r = httpx.post(f"{target.url}/v1beta/models/tiny:generateContent", json=body, headers={"x-goog-api-key": KEY})
    assert r.status_code == 200, r.text
    row = [x for x in calls(target.db) if x.id == r.json()["responseId"]][0]
    assert row.request["max_tokens"] == 3 and row.request["stop"] == ["\n\n"]
    assert row.request["messages"][0] == {"role": "system", "content": "Be brief."}


def test_keys_and_other_refusals_are_gemini_shaped(target):
    body = {"contents": [{"parts": [{"text": "x"}]}]}
    wrong = _client(target.url, key="wrong")  # (held: a client dropped mid-call closes its connection)
    with pytest.raises(errors.ClientError) as e:
        wrong.models.generate_content(model="tiny", contents="x")
    assert e.value.code == 401 and e.value.status == "UNAUTHENTICATED"
    with pytest.raises(errors.ClientError) as e:
        list(wrong.models.list())
    assert e.value.code == 401
    with _rollout(target) as ro, _rollout(target) as other:
        # a rollout's key names its own rollout only
        own = f"hrl-{ro.id}-a:{rollout_tag(KEY, ro.id)}"
        r = httpx.post(f"{target.url}/r/{other.id}/a/x/v1beta/models/tiny:generateContent", json=body,
                       headers={"x-goog-api-key": own})
        assert r.status_code == 403 and r.json()["error"]["status"] == "PERMISSION_DENIED"
        # a model method the proxy does not serve: a 404 recorded in the rollout, nothing forwarded
        r = httpx.post(f"{target.url}/r/{ro.id}/a/x/v1beta/models/tiny:embedContent", json=body,
                       headers={"x-goog-api-key": own})
        assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
        (row,) = calls(target.db, ro.id)
        assert row.status == "error" and row.error.startswith("404")
    # another path under /v1beta: Gemini's 404, not the web framework's
    r = httpx.get(f"{target.url}/v1beta/cachedContents", headers={"x-goog-api-key": KEY})
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
    # a finished rollout: 410, which the SDK does not retry
    r = httpx.post(f"{target.url}/r/{ro.id}/a/x/v1beta/models/tiny:generateContent", json=body,
                   headers={"x-goog-api-key": KEY})
    assert r.status_code == 410 and r.json()["error"]["status"] == "FAILED_PRECONDITION"


@pytest.fixture(scope="module")
def passthrough(tiny_model_dir, upstream, tokenizer_dir, tmp_path_factory):
    with serve_target("passthrough", tmp_path_factory.mktemp("gemini-pt"), tiny_model_dir, upstream,
                      tokenizer_dir) as t:
        yield t


@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
def test_thoughts_dropped_by_the_client_come_back_through_the_signature(passthrough, stream):
    """In front of an upstream (the stand-in thinks before its tool call): the thought parts, and
    the same reasoning in a thoughtSignature on the first part after them; a client that keeps
    only the signature (Gemini CLI) sends a turn the next call is found to extend."""
    contents = [types.Content(role="user", parts=[types.Part(text=QUESTION)])]
    with HarnessRL(passthrough.url).rollout() as ro:
        c = _client(ro.base_url("solo").removesuffix("/v1"))
        if stream:
            chunks = list(c.models.generate_content_stream(model="m", contents=contents, config=CONFIG))
            parts = [p for ch in chunks for p in ch.candidates[0].content.parts]
        else:
            parts = c.models.generate_content(model="m", contents=contents, config=CONFIG).candidates[0].content.parts
        thoughts = "".join(p.text for p in parts if p.thought)
        kept = [p for p in parts if not p.thought]
        assert thoughts.startswith("I should") and kept[0].thought_signature
        call = next(p.function_call for p in kept if p.function_call)
        contents += [types.Content(role="model", parts=kept), types.Content(role="user", parts=[types.Part(
            function_response=types.FunctionResponse(name=call.name, response={"output": "Paris"}))])]
        c.models.generate_content(model="m", contents=contents, config=CONFIG)
    first, second = calls(passthrough.db, ro.id)
    assert second.prefix_call_id == first.id
    assistant = second.request["messages"][2]
    assert assistant["content"].startswith("<think>\n" + thoughts)
    # a function response without an id answers the call of that name
    assert second.request["messages"][3] == {"role": "tool", "tool_call_id": call.id, "content": "Paris"}
