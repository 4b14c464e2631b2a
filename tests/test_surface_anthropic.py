"""The Anthropic Messages surface, driven by the anthropic SDK and litellm's anthropic provider over
real sockets, on the tiny model (local backend), the vLLM stand-in with prefix-consistent prompts,
and the stand-in as a pass-through upstream. The SDK's base URL is the proxy root (or
/r/{rollout}/a/{agent}): it adds /v1/messages itself."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from harnessrl.client import HarnessRL
from harnessrl.records import unpack_ids
from surface_fixtures import (TARGETS, assert_extends, assert_merged, assert_recorded, calls, compile_rollouts,
                              serve_target)

TOOLS = [{"name": "lookup", "description": "Look a word up.",
          "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}]
QUESTION = "What is the capital of france?"
# the SDK no longer has a temperature argument; the API (and this proxy) still takes it
ARGS = dict(model="tiny", max_tokens=200, system="Be brief.", tools=TOOLS, extra_body={"temperature": 0})


@pytest.fixture(scope="module", params=TARGETS)
def target(request, tiny_model_dir, upstream, tokenizer_dir, tmp_path_factory):
    with serve_target(request.param, tmp_path_factory.mktemp("anth"), tiny_model_dir, upstream,
                      tokenizer_dir) as t:
        yield t


def _client(url: str, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)


def _dump(content) -> list[dict]:
    return [b.model_dump(exclude_none=True) for b in content]


def test_tool_use_round_trip_identified_by_x_api_key(target, tmp_path):
    hrl = HarnessRL(target.url)
    with hrl.rollout() as ro:
        # the identity key as the anthropic SDK sends it (x-api-key), the base URL the proxy root
        c = _client(target.url, key=f"hrl-{ro.id}-solo")
        messages = [{"role": "user", "content": QUESTION}]
        m1 = c.messages.create(messages=messages, extra_headers={"anthropic-beta": "tools-2024-05-16"}, **ARGS)
        assert m1.stop_reason == "tool_use" and m1.id.startswith("msg_")
        (use,) = [b for b in m1.content if b.type == "tool_use"][:1]
        assert use.name == "lookup" and isinstance(use.input, dict)
        messages += [{"role": "assistant", "content": _dump(m1.content)},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": use.id, "content": "Paris 42"}]}]
        m2 = c.messages.create(messages=messages, **ARGS)
        assert m2.content and m2.usage.input_tokens > m1.usage.input_tokens
    rows = calls(target.db, ro.id)
    assert [r.agent for r in rows] == ["solo", "solo"] and [r.id for r in rows] == [m1.id[4:], m2.id[4:]]
    first = rows[0].request
    assert first["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    assert first["tools"][0]["function"]["parameters"] == TOOLS[0]["input_schema"] and first["temperature"] == 0
    surface = first["harnessrl_surface"]
    assert surface["api"] == "anthropic" and surface["body"]["system"] == "Be brief."
    # the SDK's own anthropic-version, and the beta the harness asked for
    assert surface["headers"] == {"anthropic-version": c.default_headers["anthropic-version"],
                                  "anthropic-beta": "tools-2024-05-16"}
    assert rows[0].response["id"] == m1.id and rows[0].response["content"] == _dump(m1.content)
    tool_msgs = [m for m in rows[1].request["messages"] if m["role"] == "tool"]
    assert tool_msgs == [{"role": "tool", "tool_call_id": use.id, "content": "Paris 42"}]
    assert rows[1].request["messages"][2]["tool_calls"][0]["id"] == use.id == rows[0].tool_calls[0]["id"]
    assert_recorded(rows[0])
    if target.tokens:
        assert_extends(rows[0], rows[1])
        assert_merged(compile_rollouts(target, (ro.id,), tmp_path), rows, sessions=1)
    else:
        assert_recorded(rows[1])
        assert rows[1].prefix_call_id == rows[0].id


def test_stream_sends_anthropic_events_that_add_up_to_the_message(target):
    c = _client(target.url)
    messages = [{"role": "user", "content": QUESTION}]
    plain = c.messages.create(messages=messages, **ARGS)
    with c.messages.stream(messages=messages, **ARGS) as stream:
        events = list(stream)
        final = stream.get_final_message()
    raw = [e.type for e in events]
    assert raw[0] == "message_start" and raw[-1] == "message_stop" and "message_delta" in raw
    assert raw.count("content_block_start") == raw.count("content_block_stop") == len(final.content)
    def same(content):  # tool-call ids are fresh per call
        return [{k: v for k, v in b.items() if k != "id"} for b in _dump(content)]

    assert same(final.content) == same(plain.content) and final.stop_reason == plain.stop_reason
    assert final.usage.input_tokens == plain.usage.input_tokens > 0
    deltas = {e.delta.type for e in events if e.type == "content_block_delta"}
    kinds = {b.type for b in final.content}
    assert ("input_json_delta" in deltas) == ("tool_use" in kinds)
    assert ("thinking_delta" in deltas) == ("thinking" in kinds)
    if not target.tokens:  # the stand-in thinks before its tool call: a thinking block
        assert final.content[0].type == "thinking" and final.content[0].thinking.startswith("I should")
    row = [r for r in calls(target.db) if r.id == final.id[4:]][0]
    assert row.stream and row.response["id"] == final.id
    assert_recorded(row)


def test_count_tokens_is_the_prompt_a_call_gets(target):
    c = _client(target.url)
    messages = [{"role": "user", "content": QUESTION}]
    if not target.tokens:  # no tokenizer in the proxy: the upstream renders its own prompts
        with pytest.raises(anthropic.APIStatusError) as e:
            c.messages.count_tokens(model="tiny", messages=messages, system="Be brief.", tools=TOOLS)
        assert e.value.status_code == 501 and e.value.body["error"]["type"] == "api_error"
        return
    n = c.messages.count_tokens(model="tiny", messages=messages, system="Be brief.", tools=TOOLS).input_tokens
    m = c.messages.create(messages=messages, **ARGS)
    row = [r for r in calls(target.db) if r.id == m.id[4:]][0]
    assert n == len(unpack_ids(row.prompt_ids)) == m.usage.input_tokens


def test_litellm_anthropic_path(target):
    import litellm

    hrl = HarnessRL(target.url)
    with hrl.rollout() as ro:
        r = litellm.completion(model="anthropic/tiny", messages=[{"role": "user", "content": QUESTION}],
                               api_base=ro.base_url("solo").removesuffix("/v1"), api_key="unused", temperature=0,
                               max_tokens=200)
    (row,) = calls(target.db, ro.id)
    assert_recorded(row)
    assert row.request["harnessrl_surface"]["api"] == "anthropic" and row.agent == "solo"
    assert r.choices[0].message.content == (row.response["content"] and "".join(
        b["text"] for b in row.response["content"] if b["type"] == "text") or None)


@pytest.mark.parametrize("body, where", [
    ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, "messages.0"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
     "messages.0.content.0.type"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
     "messages.0.content.0.tool_use_id"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}, {"role": "assistant",
                                                                                     "content": "pre"}]},
     "messages.1"),
    # (hosted tools such as web_search are removed, or refused with --strict-tools: test_surface_cli_requests.py)
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "computer_20250124", "name": "computer"}]}, "tools.0.type"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]},
     "tools.0.input_schema"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "x"}},
     "tool_choice"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
])
def test_malformed_requests_get_anthropic_shaped_errors(target, body, where):
    resp = httpx.post(target.url + "/v1/messages", json=body)
    assert resp.status_code == 400, resp.text
    data = resp.json()
    assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
    assert data["error"]["message"].startswith(where + ":")


def test_errors_before_the_request_is_read_are_anthropic_shaped(target):
    bad = httpx.post(target.url + "/v1/messages", content=b"{nope", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    rid = httpx.post(target.url + "/harnessrl/rollouts", json={}).json()["id"]
    httpx.post(target.url + f"/harnessrl/rollouts/{rid}/finish", json={})
    finished = httpx.post(target.url + f"/r/{rid}/a/x/v1/messages", json={"model": "m", "max_tokens": 5,
                                                                         "messages": [{"role": "user", "content": "x"}]})
    assert finished.status_code == 410 and finished.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": finished.json()["error"]["message"]}}
    bad_id = httpx.post(target.url + "/r/bad:id/a/x/v1/messages", json={"model": "m", "max_tokens": 5,
                                                                       "messages": [{"role": "user", "content": "x"}]})
    assert bad_id.status_code == 400 and bad_id.json()["type"] == "error"
    with pytest.raises(anthropic.BadRequestError):
        _client(target.url).messages.count_tokens(model="m", messages=[])


def test_the_proxy_api_key_arrives_as_x_api_key(tiny_model_dir, upstream, tokenizer_dir, tmp_path):
    with serve_target("passthrough", tmp_path, tiny_model_dir, upstream, tokenizer_dir, api_key="sekret") as t:
        with pytest.raises(anthropic.AuthenticationError) as e:
            _client(t.url, key="wrong").messages.create(model="m", max_tokens=20, messages=[
                {"role": "user", "content": "x"}])
        assert e.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                           "message": "missing or wrong API key"}}
        hrl = HarnessRL(t.url, api_key="sekret")
        with hrl.rollout() as ro:
            m = _client(t.url, key=f"hrl-{ro.id}-solo:sekret").messages.create(
                model="m", max_tokens=200, messages=[{"role": "user", "content": "x"}])
        (row,) = calls(t.db, ro.id)
        assert row.id == m.id[4:] and row.agent == "solo"
        # a stream that breaks after its start ends with Anthropic's error event
        with pytest.raises(anthropic.APIStatusError, match="malformed upstream response"):
            with _client(t.url, key="sekret").messages.stream(model="bad-chunk", max_tokens=200, messages=[
                    {"role": "user", "content": "x"}]) as stream:
                list(stream)
        assert calls(t.db)[-1].status == "error"
