"""The OpenAI Responses API surface, driven by the openai SDK, the OpenAI Agents SDK (its default,
Responses mode) and litellm over real sockets, on the tiny model (local backend), the vLLM
stand-in with prefix-consistent prompts, and the stand-in as a pass-through upstream."""

from __future__ import annotations

import asyncio
import base64

import httpx
import openai
import pytest

from harnessrl.client import HarnessRL
from surface_fixtures import (TARGETS, assert_extends, assert_merged, assert_recorded, calls, compile_rollouts,
                              serve_target)

TOOLS = [{"type": "function", "name": "lookup", "description": "Look a word up.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}]
QUESTION = "What is the capital of france?"
ARGS = dict(model="tiny", tools=TOOLS, instructions="Be brief.", temperature=0, max_output_tokens=200)


@pytest.fixture(scope="module", params=TARGETS)
def target(request, tiny_model_dir, upstream, tokenizer_dir, tmp_path_factory):
    with serve_target(request.param, tmp_path_factory.mktemp("resp"), tiny_model_dir, upstream,
                      tokenizer_dir) as t:
        yield t


def _client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def _tool_result(r) -> dict:
    (fc,) = [o for o in r.output if o.type == "function_call"][:1]
    return {"type": "function_call_output", "call_id": fc.call_id, "output": "Paris 42"}


def test_function_tool_round_trip_through_items_and_previous_response_id(target, tmp_path):
    hrl = HarnessRL(target.url)
    with hrl.rollout() as by_items, hrl.rollout() as by_id:
        c = _client(by_items.base_url("solo"))
        r1 = c.responses.create(input=QUESTION, **ARGS)
        assert r1.status == "completed" and r1.id.startswith("resp_")
        fc = [o for o in r1.output if o.type == "function_call"]
        assert len(fc) == 1 and fc[0].name == "lookup" and fc[0].call_id.startswith("call_")
        # the harness sends the whole conversation back as items: the model's output items as they came
        items = [{"role": "user", "content": QUESTION}, *[o.model_dump(exclude_none=True) for o in r1.output],
                 _tool_result(r1)]
        r2 = c.responses.create(input=items, **ARGS)
        assert r2.status == "completed" and r2.output

        c = _client(by_id.base_url("solo"))
        s1 = c.responses.create(input=QUESTION, **ARGS)
        s2 = c.responses.create(input=[_tool_result(s1)], previous_response_id=s1.id, **ARGS)
        assert s2.previous_response_id == s1.id
        stored = c.responses.retrieve(s1.id)
        assert stored.model_dump() == s1.model_dump()
    a, b = calls(target.db, by_items.id), calls(target.db, by_id.id)
    assert [x.id for x in a] == [r1.id[5:], r2.id[5:]] and [x.id for x in b] == [s1.id[5:], s2.id[5:]]
    # the records hold the translated chat request, and the Responses request beside it
    first = a[0].request
    assert first["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    assert first["tools"][0]["function"]["name"] == "lookup" and first["max_tokens"] == 200
    assert first["harnessrl_surface"]["api"] == "responses" and first["harnessrl_surface"]["body"]["input"] == QUESTION
    assert a[0].response["id"] == r1.id and a[0].tool_calls[0]["id"] == fc[0].call_id
    # both ways rebuild the same chat conversation, so the second call extends the first
    assert [m["role"] for m in b[1].request["messages"]] == ["system", "user", "assistant", "tool"]
    assert b[1].request["messages"][2]["tool_calls"] == b[0].tool_calls
    for rows in (a, b):
        assert_recorded(rows[0])
        if target.tokens:
            assert_extends(rows[0], rows[1])
        else:  # a pass-through upstream renders the prompt itself; the earlier call is still named
            assert_recorded(rows[1])
            assert rows[1].prefix_call_id == rows[0].id and rows[1].prompt_path == "render"
    if target.tokens:
        assert a[1].prompt_ids == b[1].prompt_ids
        assert_merged(compile_rollouts(target, (by_items.id, by_id.id), tmp_path), a + b, sessions=2)


def test_stream_sends_the_official_events_and_ends_in_the_stored_response(target):
    c = _client(target.url + "/v1")
    plain = c.responses.create(input=QUESTION, **ARGS)
    with c.responses.stream(input=QUESTION, **ARGS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    done = [e.output_index for e in events if e.type == "response.output_item.done"]
    assert added == done == list(range(len(final.output)))
    # what was streamed adds up to the final items, which are the non-streamed answer's
    for i, item in enumerate(final.output):
        if item.type == "function_call":
            pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"
                      and e.output_index == i]
            assert "".join(pieces) == item.arguments
        elif item.type == "reasoning":
            pieces = [e.delta for e in events if e.type == "response.reasoning_text.delta" and e.output_index == i]
            assert "".join(pieces) == item.content[0].text
        else:
            pieces = [e.delta for e in events if e.type == "response.output_text.delta" and e.output_index == i]
            assert "".join(pieces) == item.content[0].text
    assert [o.type for o in final.output] == [o.type for o in plain.output]
    assert final.output_text == plain.output_text
    assert [(o.name, o.arguments) for o in final.output if o.type == "function_call"] == \
        [(o.name, o.arguments) for o in plain.output if o.type == "function_call"]
    row = [x for x in calls(target.db) if x.id == final.id[5:]][0]
    assert_recorded(row)
    assert row.stream and row.response == httpx.get(f"{target.url}/v1/responses/{final.id}").json()
    assert [(o["type"], o["id"]) for o in row.response["output"]] == [(o.type, o.id) for o in final.output]
    if not target.tokens:  # the pass-through upstream's reasoning, as a reasoning item
        assert final.output[0].type == "reasoning" and final.output[0].content[0].text.startswith("I should")


def test_logprobs_are_returned_when_included(target):
    # after a tool's result both models answer with text (the stand-in once no tools are offered)
    items = [{"role": "user", "content": QUESTION},
             {"type": "function_call", "call_id": "call_0", "name": "lookup", "arguments": '{"query": "france"}'},
             {"type": "function_call_output", "call_id": "call_0", "output": "Paris 42"}]
    r = _client(target.url + "/v1").responses.create(input=items, include=["message.output_text.logprobs"],
                                                      model="tiny", temperature=0, max_output_tokens=200,
                                                      **({"tools": TOOLS} if target.name == "local" else {}))
    row = [x for x in calls(target.db) if x.id == r.id[5:]][0]
    _, completion = assert_recorded(row)
    lps = [lp.logprob for o in r.output if o.type == "message" for lp in o.content[0].logprobs]
    assert lps and len(lps) == len(completion)


@pytest.mark.parametrize("name", ["local", "standin"])
def test_agents_sdk_default_mode_runs_and_streams_with_a_function_tool(name, tiny_model_dir, upstream, tokenizer_dir,
                                                                      tmp_path):
    from agents import (Agent, ModelSettings, Runner, function_tool, set_default_openai_client,
                        set_tracing_disabled)
    from agents.items import ToolCallItem

    seen: list[str] = []

    @function_tool
    def lookup(query: str) -> str:
        """Look a word up."""
        seen.append(query)
        return "Paris 42"

    async def run(base_url: str, streamed: bool):
        set_tracing_disabled(True)
        set_default_openai_client(openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0),
                                  use_for_tracing=False)
        agent = Agent(name="solo", instructions="Be brief.", tools=[lookup], model="tiny",
                      model_settings=ModelSettings(temperature=0, max_tokens=200))
        if not streamed:
            return await Runner.run(agent, QUESTION, max_turns=6), []
        result = Runner.run_streamed(agent, QUESTION, max_turns=6)
        return result, [ev.type async for ev in result.stream_events()]

    with serve_target(name, tmp_path, tiny_model_dir, upstream, tokenizer_dir) as t:
        hrl = HarnessRL(t.url)
        with hrl.rollout() as ro_run, hrl.rollout() as ro_stream:
            # one rollout per run: the identity is in the base URL, as for any harness
            ran, _ = asyncio.run(run(ro_run.base_url("solo"), streamed=False))
            streamed, kinds = asyncio.run(run(ro_stream.base_url("solo"), streamed=True))
        for result, ro in ((ran, ro_run), (streamed, ro_stream)):
            assert any(isinstance(i, ToolCallItem) for i in result.new_items)
            rows = calls(t.db, ro.id)
            assert len(rows) >= 2 and all(r.request["harnessrl_surface"]["api"] == "responses" for r in rows)
            for earlier, later in zip(rows, rows[1:]):  # every turn extends the one before, token-exactly
                assert_extends(earlier, later)
        assert "raw_response_event" in kinds and all(r.stream for r in calls(t.db, ro_stream.id))
        if name == "local":  # the tiny model calls the tool as declared, and answers its result with text
            assert seen and isinstance(ran.final_output, str) and ran.final_output
        rows = calls(t.db, ro_run.id)
        assert_merged(compile_rollouts(t, (ro_run.id,), tmp_path / "out"), rows, sessions=1)


def test_litellm_responses_path(target):
    import litellm

    hrl = HarnessRL(target.url)
    with hrl.rollout() as ro:
        r = litellm.responses(model="openai/tiny", input=QUESTION, tools=TOOLS, api_base=ro.base_url("solo"),
                              api_key="unused", temperature=0, max_output_tokens=200)
    (row,) = calls(target.db, ro.id)
    assert_recorded(row)
    assert row.request["harnessrl_surface"]["api"] == "responses"
    # litellm wraps the response id with its provider (base64); the proxy's id is inside
    assert ("resp_" + row.id).encode() in base64.b64decode(r.id.removeprefix("resp_"))
    assert [o.type for o in r.output] == [o["type"] for o in row.response["output"]]


@pytest.mark.parametrize("body, status, param", [
    ({"model": "m"}, 400, "input"),
    ({"model": "m", "input": 3}, 400, "input"),
    ({"model": "m", "input": [{"type": "message", "role": "robot", "content": "x"}]}, 400, "input[0].role"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, 400,
     "input[0].content[0]"),
    ({"model": "m", "input": [{"type": "web_search_call", "id": "x"}]}, 400, "input[0].type"),
    ({"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, 400, "input[0].arguments"),
    # (hosted tools such as web_search are removed, or refused with --strict-tools: test_surface_cli_requests.py)
    ({"model": "m", "input": "x", "tools": [{"type": "local_shell"}]}, 400, "tools[0].type"),
    ({"model": "m", "input": "x", "tools": [{"type": "computer_use_preview"}]}, 400, "tools[0].type"),
    ({"model": "m", "input": "x", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"model": "m", "input": "x", "temperature": "hot"}, 400, "temperature"),
    ({"model": "m", "input": "x", "text": {"format": {"type": "json_schema"}}}, 400, "text.format"),
    ({"model": "m", "input": "x", "tool_choice": {"type": "web_search"}}, 400, "tool_choice"),
    ({"model": "m", "input": "x", "background": True}, 400, "background"),
    ({"model": "m", "input": "x", "previous_response_id": "resp_nope"}, 400, "previous_response_id"),
    ({"model": "m", "input": []}, 400, "messages"),
])
def test_malformed_requests_get_openai_shaped_errors(target, body, status, param):
    resp = httpx.post(target.url + "/v1/responses", json=body)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


def test_errors_outside_the_body(target):
    c = _client(target.url + "/v1")
    bad = httpx.post(target.url + "/v1/responses", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve("resp_" + "0" * 32)
    rid = httpx.post(target.url + "/harnessrl/rollouts", json={}).json()["id"]
    httpx.post(target.url + f"/harnessrl/rollouts/{rid}/finish", json={})
    finished = httpx.post(target.url + f"/r/{rid}/a/x/v1/responses", json={"model": "m", "input": "x"})
    assert finished.status_code == 410 and finished.json()["error"]["code"] == "rollout_finished"
    # store: false is recorded like any call, but cannot be fetched or extended
    r = c.responses.create(input="Say something.", store=False, model="tiny", max_output_tokens=5)
    assert r.id[5:] in {x.id for x in calls(target.db)}
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError, match="not found"):
        c.responses.create(input="more", previous_response_id=r.id, model="tiny")


def test_a_stream_that_fails_after_its_start_ends_with_response_failed(upstream, tokenizer_dir, tmp_path,
                                                                      tiny_model_dir):
    with serve_target("passthrough", tmp_path, tiny_model_dir, upstream, tokenizer_dir) as t:
        with _client(t.url + "/v1").responses.stream(model="bad-chunk", input=QUESTION) as stream:
            events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-2:] == ["error", "response.failed"]
    assert events[-1].response.error.code == "upstream_malformed"
    (row,) = calls(t.db)
    assert row.status == "error" and "malformed upstream response" in row.error


CONTENTS = ["plain text", "<think>\nweigh it\n</think>\n\nThe answer.", "<think>\nonly thought\n</think>",
            "<think>\nleft open", "<thin", "<think>\nx\n</think>\nno blank line", ""]


@pytest.mark.unit
@pytest.mark.parametrize("content", CONTENTS)
def test_a_streamed_answer_splits_into_the_blocks_of_the_whole(content):
    from harnessrl.proxy.protocol import Delta, Result
    from harnessrl.proxy.surfaces.blocks import BlockStream, blocks_of, join_think, split_think

    calls_ = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    whole = blocks_of(Result(text=content or None, finish_reason="tool_calls", usage=None,
                             message={"role": "assistant", "content": content or None, "tool_calls": calls_}))
    stream = BlockStream()
    events = [e for ch in content for e in stream.feed([Delta(content=ch)])]
    events += stream.feed([Delta(tool_calls=[{"index": 0, **calls_[0]}])]) + stream.finish()
    assert [(b.kind, b.text, b.call_id) for b in stream.blocks] == [(b.kind, b.text, b.call_id) for b in whole]
    # every block opens once, closes once, and its pieces add up to it
    for i, b in enumerate(stream.blocks):
        assert [e.op for e in events if e.index == i][0] == "open" and [e.op for e in events if e.index == i][-1] == \
            "close"
        assert "".join(e.piece for e in events if e.index == i and e.op == "piece") == b.text
    reasoning, text = split_think(content)
    if "\n</think>\n\n" in content or content.endswith("\n</think>") or reasoning is None:
        assert (join_think(reasoning, text) or "") == content  # the template's form comes back exactly


@pytest.mark.unit
def test_a_run_of_assistant_items_is_one_chat_message():
    from harnessrl.proxy.surfaces.responses.request import to_request

    req = to_request({"model": "m", "instructions": "sys", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "r"},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "r2"}]}]})
    assert req.body["messages"] == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>\nhm\n</think>\n\nok", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"}]
