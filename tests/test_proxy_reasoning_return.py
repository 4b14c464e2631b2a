"""Reasoning that comes back beside the content (docs/methods.md §2): litellm, the client of
mini-swe-agent, moves the model's `<think>…</think>` out of the content into `reasoning_content`;
a harness that sends the assistant message back that way must still find the turn it extends
(prefix-consistent prompts, one sample per session), and one that drops the reasoning must not.
Driven by litellm over a real socket, against the proxy with prefix-consistent prompts over the
vLLM stand-in (which thinks before every tool call) and, for the split, the local tiny model."""

from __future__ import annotations

import pytest

from harnessrl.client import HarnessRL
from surface_fixtures import assert_extends, assert_merged, calls, compile_rollouts, serve_target

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                           "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                                          "required": ["query"]}}}]


@pytest.fixture(scope="module")
def standin(tiny_model_dir, upstream, tokenizer_dir, tmp_path_factory):
    with serve_target("standin", tmp_path_factory.mktemp("reason"), tiny_model_dir, upstream, tokenizer_dir) as t:
        yield t


def _session(url: str, back, turns: int = 3) -> tuple[str, list]:
    """A mini-swe-agent-shaped loop through litellm: each assistant message goes back as
    `back(message)` builds it, each tool call gets a result."""
    import litellm  # after surface_fixtures: it keeps litellm off the network

    hrl = HarnessRL(url)
    with hrl.rollout() as ro:
        messages: list[dict] = [{"role": "system", "content": "You are a helpful assistant."},
                                {"role": "user", "content": "Look up the capital of spain."}]
        replies = []
        for turn in range(turns):
            r = litellm.completion(model="openai/tiny", api_base=ro.base_url("agent"), api_key="unused",
                                   messages=messages, tools=TOOLS, temperature=0, max_tokens=200)
            msg = r.choices[0].message
            replies.append(msg)
            messages.append(back(msg))
            for tc in msg.tool_calls or []:
                messages.append({"role": "tool", "tool_call_id": tc.id, "content": f"result {turn}: madrid"})
    return ro.id, replies


def _calls_of(msg) -> list[dict]:
    return [{"id": tc.id, "type": "function", "function": {"name": tc.function.name,
                                                           "arguments": tc.function.arguments}}
            for tc in msg.tool_calls or []]


def _with_reasoning(msg) -> dict:
    # content "" and the think text in reasoning_content, as litellm hands them over
    return {"role": "assistant", "content": msg.content or "", "reasoning_content": msg.reasoning_content,
            "tool_calls": _calls_of(msg)}


def _without_reasoning(msg) -> dict:
    return {"role": "assistant", "content": msg.content or "", "tool_calls": _calls_of(msg)}


def test_litellm_splits_the_think_block_out_of_the_content(standin):
    _, (reply, *_) = _session(standin.url, _with_reasoning, turns=1)
    # the proxy's answer holds the model's think block; litellm moved it
    assert reply.reasoning_content.strip().startswith("I should look up")
    assert "<think>" not in (reply.content or "") and reply.tool_calls


def test_reasoning_content_sent_back_finds_the_turn_it_extends(standin, tmp_path):
    rollout, replies = _session(standin.url, _with_reasoning)
    rows = calls(standin.db, rollout)
    assert len(rows) == 3 and all(r.tool_calls for r in rows)
    # what the harness sent back: no think block in the content, the reasoning beside it
    sent = rows[1].request["messages"][2]
    assert sent["content"] == "" or "<think>" not in sent["content"]
    assert sent["reasoning_content"] == replies[0].reasoning_content
    for earlier, later in zip(rows, rows[1:]):
        assert_extends(earlier, later)
    assert_merged(compile_rollouts(standin, (rollout,), tmp_path), rows, sessions=1)


def test_dropped_reasoning_is_rendered_fresh(standin, tmp_path):
    rollout, _ = _session(standin.url, _without_reasoning)
    rows = calls(standin.db, rollout)
    # the model's own turn is not in the prompt the harness sent: nothing to extend
    assert [r.prompt_path for r in rows] == ["render"] * 3 and [r.prefix_call_id for r in rows] == [None] * 3
    totals = compile_rollouts(standin, (rollout,), tmp_path)
    assert (totals["samples"], totals["merges"]) == (3, 0)
