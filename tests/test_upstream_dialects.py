"""Upstream dialects and TLS: the internal chat request translated for an Anthropic Messages
upstream and its answer (whole or streamed) translated back, checked by hand here; end to end
(proxy on a socket, openai SDK as the harness, stand-ins as the providers) further down."""

from __future__ import annotations

import orjson
import pytest

from harnessrl.proxy.errors import ProxyError, UpstreamMalformed
from harnessrl.proxy.upstream.anthropic import _Assembler, from_message, to_messages_request

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look up a key.",
                                           "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}]


@pytest.mark.unit
def test_chat_to_anthropic_request():
    body = {"model": "claude-x", "max_tokens": 50, "temperature": 0.5, "stop": "END", "tools": TOOLS,
            "tool_choice": "required",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "Use tools."},
                         {"role": "user", "content": [{"type": "text", "text": "Find "}, {"type": "text", "text": "pi"}]},
                         {"role": "assistant", "content": "Looking.", "tool_calls": [
                             {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"query": "pi"}'}},
                             {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": "{bad"}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "3.14"},
                         {"role": "tool", "tool_call_id": "c2", "content": "error"},
                         {"role": "user", "content": "And?"}]}
    out = to_messages_request(body, default_max_tokens=256)
    assert out["system"] == "Be brief.\n\nUse tools." and out["max_tokens"] == 50 and out["stop_sequences"] == ["END"]
    assert out["tool_choice"] == {"type": "any"} and out["tools"][0]["input_schema"]["properties"] == {"query": {"type": "string"}}
    assert [t["role"] for t in out["messages"]] == ["user", "assistant", "user"]  # tool results + next question merged
    assert out["messages"][0]["content"] == [{"type": "text", "text": "Find pi"}]
    assistant = out["messages"][1]["content"]
    assert assistant[0] == {"type": "text", "text": "Looking."}
    assert assistant[1] == {"type": "tool_use", "id": "c1", "name": "lookup", "input": {"query": "pi"}}
    assert assistant[2]["input"] == {"_raw": "{bad"}  # malformed arguments kept, not dropped
    assert out["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "c1", "content": "3.14"},
                                             {"type": "tool_result", "tool_use_id": "c2", "content": "error"},
                                             {"type": "text", "text": "And?"}]
    named = to_messages_request({"messages": [{"role": "user", "content": "q"}], "tool_choice": {
        "type": "function", "function": {"name": "lookup"}}}, default_max_tokens=7)
    assert named["tool_choice"] == {"type": "tool", "name": "lookup"} and named["max_tokens"] == 7
    with pytest.raises(ProxyError, match=r"messages\[0\].content\[0\]"):
        to_messages_request({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 5)


@pytest.mark.unit
def test_anthropic_message_to_result():
    r = from_message({"type": "message", "role": "assistant", "stop_reason": "tool_use",
                      "usage": {"input_tokens": 11, "output_tokens": 4},
                      "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Calling."},
                                  {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"query": "pi"}}]})
    assert r.finish_reason == "tool_calls" and r.usage == {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}
    assert r.message == {"role": "assistant", "content": "Calling.", "reasoning_content": "hmm", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "lookup", "arguments": '{"query":"pi"}'}}]}
    assert r.prompt_ids is None and r.completion_ids is None and r.logprobs is None  # text only
    only_call = from_message({"type": "message", "stop_reason": "max_tokens", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]})
    assert only_call.text is None and only_call.finish_reason == "length"
    with pytest.raises(UpstreamMalformed):
        from_message({"choices": []})


def _ev(kind: str, **data) -> bytes:
    return orjson.dumps({"type": kind, **data})


@pytest.mark.unit
def test_anthropic_stream_to_deltas_and_result():
    asm = _Assembler()
    events = [_ev("message_start", message={"type": "message", "role": "assistant", "content": [],
                                            "usage": {"input_tokens": 9, "output_tokens": 1}}),
              _ev("ping"),
              _ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
              _ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"}),
              _ev("content_block_stop", index=0),
              _ev("content_block_start", index=1, content_block={"type": "tool_use", "id": "t9", "name": "f", "input": {}}),
              _ev("content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": '{"a":'}),
              _ev("content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": " 1}"}),
              _ev("content_block_stop", index=1),
              _ev("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 6}),
              _ev("message_stop")]
    deltas = [d for d in (asm.feed(e) for e in events) if d is not None]
    assert deltas[0].role == "assistant" and deltas[1].content == "Hi"
    assert deltas[2].tool_calls == [{"index": 0, "id": "t9", "type": "function", "function": {"name": "f", "arguments": ""}}]
    assert "".join(d.tool_calls[0]["function"]["arguments"] for d in deltas[3:]) == '{"a": 1}'
    r = asm.finish()
    assert r.text == "Hi" and r.finish_reason == "tool_calls" and r.usage["completion_tokens"] == 6
    assert r.message["tool_calls"][0]["function"]["arguments"] == '{"a":1}'
    with pytest.raises(ProxyError, match="overloaded"):
        _Assembler().feed(_ev("error", error={"type": "overloaded_error", "message": "overloaded"}))
    with pytest.raises(UpstreamMalformed):
        _Assembler().feed(_ev("content_block_delta", index=0, delta={}))


@pytest.mark.unit
def test_chat_to_responses_request_and_back():
    from harnessrl.proxy.upstream.openai_responses import from_response, to_responses_request

    body = {"model": "gpt-x", "max_tokens": 30, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "lookup"}},
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}},
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Find pi"},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"query":"pi"}'}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "3.14"}]}
    out = to_responses_request(body)
    assert out["instructions"] == "Be brief." and out["store"] is False and out["max_output_tokens"] == 30
    assert out["input"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Find pi"}]},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"query":"pi"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "3.14"}]
    assert out["tool_choice"] == {"type": "function", "name": "lookup"}
    assert out["tools"][0]["name"] == "lookup" and out["text"]["format"]["name"] == "a"
    r = from_response({"object": "response", "status": "completed", "usage": {"input_tokens": 5, "output_tokens": 2},
                       "output": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
                                  {"type": "function_call", "call_id": "k", "name": "lookup", "arguments": "{}"}]})
    assert r.finish_reason == "tool_calls" and r.message["reasoning_content"] == "think" and r.text is None
    assert r.message["tool_calls"] == [{"id": "k", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]
    cut = from_response({"object": "response", "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
                         "output": [{"type": "message", "content": [{"type": "output_text", "text": "par"}]}]})
    assert cut.text == "par" and cut.finish_reason == "length"
    with pytest.raises(ProxyError, match="boom"):
        from_response({"object": "response", "status": "failed", "output": [], "error": {"message": "boom"}})
