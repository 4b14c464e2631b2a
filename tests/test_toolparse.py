"""Hermes tool-call parsing and the streaming hold-back rule, on exact strings."""

from __future__ import annotations

import json
import re

import pytest

from harnessrl.proxy.routes.hermes_tools import parse_hermes, streamable_prefix

pytestmark = pytest.mark.unit  # no server, database or training: also run on Python 3.12 in CI

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"query": "paris", "n": 2}}\n</tool_call>'


def _fn(call: dict) -> tuple[str, dict]:
    assert call["type"] == "function"
    assert re.fullmatch(r"call_[0-9a-f]{24}", call["id"])
    return call["function"]["name"], json.loads(call["function"]["arguments"])


def test_plain_text_is_content_unchanged():
    assert parse_hermes("Hello there.\n") == ("Hello there.\n", [])
    assert parse_hermes(" \n ") == (None, [])
    assert parse_hermes("") == (None, [])


def test_one_call_and_no_content():
    content, calls = parse_hermes(CALL)
    assert content is None
    assert [_fn(c) for c in calls] == [("lookup", {"query": "paris", "n": 2})]
    # arguments are re-serialised JSON text, as OpenAI sends them
    assert calls[0]["function"]["arguments"] == '{"query": "paris", "n": 2}'


def test_think_stays_in_content_and_whitespace_next_to_blocks_goes():
    text = "<think>\nI should look it up.\n</think>\n\n" + CALL
    content, calls = parse_hermes(text)
    assert content == "<think>\nI should look it up.\n</think>"
    assert len(calls) == 1


def test_two_calls_text_between_and_after():
    second = '<tool_call>{"name": "calc", "arguments": {}}</tool_call>'
    content, calls = parse_hermes("First.\n" + CALL + "\nThen.\n" + second + "\nDone.")
    assert content == "First.\nThen.\nDone."
    assert [_fn(c) for c in calls] == [("lookup", {"query": "paris", "n": 2}), ("calc", {})]
    assert calls[0]["id"] != calls[1]["id"]


def test_invalid_blocks_stay_as_text():
    bad_json = '<tool_call>\n{"name": "lookup", "arguments": {"query": }\n</tool_call>'
    no_name = '<tool_call>{"arguments": {}}</tool_call>'
    args_not_object = '<tool_call>{"name": "x", "arguments": "q"}</tool_call>'
    for block in (bad_json, no_name, args_not_object):
        assert parse_hermes("Hi " + block) == ("Hi " + block, [])
    # a valid call next to an invalid one: only the valid one leaves the content
    content, calls = parse_hermes(bad_json + CALL)
    assert content == bad_json
    assert [_fn(c)[0] for c in calls] == ["lookup"]


def test_unclosed_block_is_text():
    text = '<tool_call>\n{"name": "lookup", "arguments": {}}'
    assert parse_hermes(text) == (text, [])


def test_non_ascii_arguments_round_trip():
    _, calls = parse_hermes('<tool_call>{"name": "t", "arguments": {"city": "Zürich"}}</tool_call>')
    assert calls[0]["function"]["arguments"] == '{"city": "Zürich"}'


def test_streamable_prefix_exact_cases():
    assert streamable_prefix("Hello") == 5
    assert streamable_prefix("Hello ") == 5  # trailing whitespace may precede a tool call
    assert streamable_prefix("Hello <tool") == 5  # could be the start of <tool_call>
    assert streamable_prefix("Hello <tools are great") == len("Hello <tools are great")
    assert streamable_prefix("Hi\n<tool_call>\n{") == 2
    assert streamable_prefix("a < b") == 5
    assert streamable_prefix("") == 0


def test_streamed_prefix_is_always_a_prefix_of_the_final_content():
    finals = [
        "<think>\nhm\n</think>\n\n" + CALL,
        "Answer: 3 < 4 and <b>ok</b>.",
        "Text " + CALL + " more <tool_call>bad</tool_call> end",
        "  \n" + CALL,
    ]
    for final in finals:
        content = parse_hermes(final)[0] or ""
        streamed = 0
        for end in range(len(final) + 1):
            n = streamable_prefix(final[:end])
            assert n >= streamed, (final, end)  # never takes back what was sent
            streamed = n
            assert content.startswith(final[:n]), (final, end)
