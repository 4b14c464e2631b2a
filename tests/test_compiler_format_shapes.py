"""A turn with one valid tool call and one that does not parse scores the same whichever server
recorded it: vLLM's hermes parser (any broken block → the whole text is content, no tool_calls) or
the proxy's own (`routes.hermes_tools.parse_hermes`: the valid block becomes a tool call, the broken one stays
in the content). Both must count 1 valid of 2 attempted: `tool_format` 0.5 and MATPO's rate 1/2."""

import pytest

from harnessrl.compiler import advantages as adv
from harnessrl.compiler.response import parse_response
from harnessrl.compiler.rewards import call_valid, tool_format
from harnessrl.proxy.routes.hermes_tools import parse_hermes

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]
TEXT = ('<think>\nTwo lookups.\n</think>\n\n'
        '<tool_call>\n{"name": "lookup", "arguments": {"key": "alpha"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "lookup", "arguments": {"key": "beta"\n</tool_call>')


def shapes() -> dict:
    content, calls = parse_hermes(TEXT)
    assert len(calls) == 1 and "beta" in content and "alpha" not in content  # the proxy's record shape
    return {"vllm": (TEXT, None), "proxy": (content, calls)}


@pytest.mark.unit
@pytest.mark.parametrize("shape", ["vllm", "proxy"])
def test_valid_and_broken_call_count_the_same_in_both_record_shapes(shape):
    text, native = shapes()[shape]
    calls = parse_response(text, native).calls
    # 2 attempts: lookup(alpha) valid, the broken block an attempt with no name and no arguments
    assert sorted((c.name or "", c.arguments is not None) for c in calls) == [("", False), ("lookup", True)]
    assert [call_valid(c, TOOLS) for c in calls].count(True) == 1
    assert tool_format(calls, TOOLS) == 0.5  # 1 valid ÷ 2 attempted (the bug gave 1.0 for "proxy")
    # MATPO, a planner with this one turn and no worker: R = 0.9·acc + 0.1·(½·fmt_p + ½·fmt_w), fmt_w = 0
    # (no worker session); acc = 1, fmt_p = 1/2 → 0.9 + 0.1·0.25 = 0.925 (the bug gave 0.95)
    fmt_p = sum(call_valid(c, TOOLS) for c in calls) / len(calls)  # scoring's calls_valid ÷ calls_attempted
    assert adv.matpo_reward(1.0, fmt_p, []) == pytest.approx(0.925)


@pytest.mark.unit
def test_a_valid_block_left_beside_native_calls_is_not_counted_twice():
    # A server that keeps the call's text in the content and also returns it as a tool call: one attempt.
    block = '<tool_call>\n{"name": "lookup", "arguments": {"key": "alpha"}}\n</tool_call>'
    _, calls = parse_hermes(block)
    assert len(parse_response(block, calls).calls) == 1


def test_compile_scores_both_record_shapes_alike(db_target, tiny_model_dir, tmp_path):
    # End to end: two rollouts of one group generated the same tokens; r1 recorded as vLLM does
    # (all text, no tool_calls), r2 as the proxy's own parser does (the valid call in tool_calls, the
    # broken block in the content). `compile --process tool_format` gives both turns 1 of 2 = 0.5.
    import json
    import time

    from test_compiler_pipeline import Recorder, compile_
    from transformers import AutoTokenizer

    from harnessrl.records import Call, pack_ids

    rec = Recorder(db_target, AutoTokenizer.from_pretrained(tiny_model_dir))
    messages = [{"role": "user", "content": "Look up alpha and beta."}]
    prompt = rec.render(messages, TOOLS)
    completion = rec.enc(TEXT) + [rec.eos]
    content, native = shapes()["proxy"]
    for rid, text, calls in (("r1", TEXT, None), ("r2", content, native)):
        rec.rollout(rid, "t1", "g", reward=1.0)
        with rec.make.begin() as s:
            s.add(Call(id=f"{rid}c", rollout_id=rid, seq=0, agent="planner", endpoint="chat",
                       request={"messages": messages, "tools": TOOLS}, response_text=text, tool_calls=calls, status="ok",
                       prompt_ids=pack_ids(prompt), completion_ids=pack_ids(completion), weight_version="v0", created_at=time.time()))
    _, samples = compile_(db_target, tmp_path, tiny_model_dir, advantage="grpo", process=("tool_format",))
    for rid in ("r1", "r2"):
        (row,) = [r for r in samples.values() if r["rollout_id"] == rid]
        assert json.loads(row["reward_breakdown"])["process"][f"{rid}c"] == {"tool_format": 0.5}, rid

