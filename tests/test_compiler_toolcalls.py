"""`harnessrl.toolcalls`: the one rule for a hermes `<tool_call>` body (proxy and compiler)."""

import json

import pytest

from harnessrl.compiler.response import parse_response
from harnessrl.toolcalls import ToolCall, parse_arguments, parse_tool_call

pytestmark = pytest.mark.unit  # no server, database or training: also run on Python 3.12 in CI


@pytest.mark.parametrize("body", [
    '{"name": "search", "arguments": {"q": "Paris", "n": 2}}',  # hermes / Qwen
    '{"name": "search", "parameters": {"q": "Paris", "n": 2}}',  # Llama-3.1 style
    '{"name": "search", "arguments": "{\\"q\\": \\"Paris\\", \\"n\\": 2}"}',  # OpenAI wire form
    '\n  {"arguments": {"q": "Paris", "n": 2}, "name": "search"}  \n',  # key order, whitespace
])
def test_accepted_forms(body):
    call = parse_tool_call(body)
    assert call == ToolCall("search", {"q": "Paris", "n": 2})
    assert json.loads(call.arguments_json()) == {"q": "Paris", "n": 2}


def test_arguments_json_keeps_non_ascii():
    assert ToolCall("s", {"city": "Zürich"}).arguments_json() == '{"city": "Zürich"}'
    assert parse_tool_call('{"name": "s", "arguments": {}}') == ToolCall("s", {})


@pytest.mark.parametrize("body", [
    "not json",
    '["search", {}]',  # not an object
    '{"arguments": {"q": 1}}',  # no name
    '{"name": "", "arguments": {}}',  # empty name
    '{"name": 3, "arguments": {}}',  # name not a string
    '{"name": "search"}',  # no arguments
    '{"name": "search", "arguments": [1, 2]}',  # arguments not an object
    '{"name": "search", "arguments": "{bad"}',  # a string that is not JSON
    '{"name": "search", "arguments": "[1]"}',  # a string that is not an object
    '{"name": "search", "arguments": null, "parameters": {"q": 1}}',  # "arguments" present wins
])
def test_rejected(body):
    assert parse_tool_call(body) is None


def test_parse_arguments():
    assert parse_arguments({"a": 1}) == {"a": 1} and parse_arguments('{"a": 1}') == {"a": 1}
    assert parse_arguments("1") is None and parse_arguments(None) is None and parse_arguments(5) is None


def test_compiler_counts_a_rejected_block_as_an_invalid_attempt():
    text = ('<tool_call>{"name": "a", "parameters": {"k": 1}}</tool_call>'
            '<tool_call>{"name": "b", "arguments": [1]}</tool_call>')
    assert [(c.name, c.arguments) for c in parse_response(text).calls] == [("a", {"k": 1}), (None, None)]
