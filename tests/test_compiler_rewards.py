"""Outcome and process rewards (docs/methods.md §4) and MatchTIR matching (§7), against hand numbers."""

import numpy as np
import pytest

from harnessrl.compiler.response import ParsedCall
from harnessrl.compiler.matchtir import call_rewards, match, similarity, similarity_matrix, turn_rewards
from harnessrl.compiler.rewards import dispatch_ok, load_reward_fn, observed_results, tool_format
from harnessrl.errors import UserError
from harnessrl.answer_match import contains, exact_match, f1, normalize_answer

pytestmark = pytest.mark.unit  # no server, database or training: also run on Python 3.12 in CI


def shouting_reward(prediction, reference):  # a user reward function, loaded as module:function
    return 2.0 if prediction.isupper() else 0.0


def test_squad_normalisation_and_outcome_functions():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple, a pear") == "apple pear"
    # pred tokens [cat, sat, on, mat], ref [cat, on, mat]: common 3 → P = 3/4, R = 3/3,
    # F1 = 2·0.75·1 / 1.75 = 0.857142…
    assert f1("the cat sat on mat", "a cat on the mat") == pytest.approx(6 / 7)
    assert f1("dog", "cat") == 0.0
    assert f1("Paris", ["London", "paris!"]) == 1.0  # best of several references
    assert exact_match("Paris.", "paris") == 1.0 and exact_match("Paris France", "paris") == 0.0
    assert contains("It is Paris, France", "paris") == 1.0 and contains("Lyon", "paris") == 0.0
    assert contains("anything", "") == 0.0  # an empty reference is contained nowhere
    assert f1("x", None) == 0.0


def test_reward_function_lookup():
    assert load_reward_fn("f1") is f1
    fn = load_reward_fn("test_compiler_rewards:shouting_reward")
    assert fn("YES", "x") == 2.0
    with pytest.raises(UserError, match="unknown reward function 'bleu'"):
        load_reward_fn("bleu")
    with pytest.raises(UserError, match="reward function .no_such_module_xyz:fn.: cannot load it"):
        load_reward_fn("no_such_module_xyz:fn")


TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}, "n": {"type": "integer"}}, "required": ["key"]}}}]


def test_tool_format():
    calls = [
        ParsedCall("search", {"key": "a", "n": 3}),  # valid
        ParsedCall("search", {"key": "a", "n": "3"}),  # n is a string
        ParsedCall("search", {"n": 3}),  # required key missing
        ParsedCall("search", {"key": "a", "x": 1}),  # unexpected argument
        ParsedCall("lookup", {"key": "a"}),  # no such tool
        ParsedCall("search", {"key": "a", "n": True}),  # a bool is not an integer
        ParsedCall(None, None, "garbage"),  # does not parse
        ParsedCall("search", {"key": "b"}),  # valid
    ]
    # 2 valid out of 8
    assert tool_format(calls, TOOLS) == 0.25
    assert tool_format([], TOOLS) == 1.0  # no call in the unit
    # without schemas in the request only parsing is checked: 7 of 8 parse
    assert tool_format(calls, None) == 7 / 8


def test_dispatch_ok_and_observed_results():
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": []},
            {"role": "tool", "content": "ok 1"}, {"role": "tool", "content": '{"error": "boom"}'},
            {"role": "user", "content": "<tool_response>\nError: not found\n</tool_response>"}]
    results = observed_results(msgs)
    assert results == ["ok 1", '{"error": "boom"}', "\nError: not found\n"]
    # one of three results is not an error
    assert dispatch_ok(3, results) == pytest.approx(1 / 3)
    assert dispatch_ok(0, []) == 1.0 and dispatch_ok(2, []) == 1.0
    assert observed_results([{"role": "user", "content": "q"}]) == []


def test_similarity_by_hand():
    ref = ("search", {"q": "paris", "n": 3})
    # same keys (Jaccard 1), one equal value: (1 + 1 + 1) / (2 + 2) = 0.75
    assert similarity("search", {"q": "paris", "n": 4}, *ref) == 0.75
    # keys {q, extra} vs {q, n}: Jaccard 1/3, one equal value: (1 + 1/3 + 1) / 4 = 7/12; names compare case-insensitively
    assert similarity("Search", {"q": "paris", "extra": 1}, *ref) == pytest.approx(7 / 12)
    assert similarity("lookup", {"q": "paris", "n": 3}, *ref) == 0.0
    assert similarity(None, None, *ref) == 0.0
    # no arguments on either side: (1 + 1 + 0) / (2 + 0) = 1
    assert similarity("ping", {}, "ping", {}) == 1.0


def test_greedy_and_hungarian_differ():
    ref = [("f", {"a": 1, "b": 2}), ("f", {"a": 9, "c": 3})]
    pred = [("f", {"a": 1, "c": 3}), ("f", {"a": 9}), ("h", {})]
    # S11: keys {a,c}/{a,b} → J = 1/3, a equal → (1 + 1/3 + 1)/4 = 7/12 ≈ 0.5833
    # S12: keys {a,c}/{a,c} → J = 1, c equal → (1 + 1 + 1)/4 = 0.75
    # S21: keys {a}/{a,b} → J = 1/2, none equal → (1 + 0.5)/4 = 0.375
    # S22: keys {a}/{a,c} → J = 1/2, a equal → (1 + 0.5 + 1)/4 = 0.625
    # row 3: another tool name → 0 everywhere (unmatched)
    sim = similarity_matrix(pred, ref)
    assert np.allclose(sim, [[7 / 12, 0.75], [0.375, 0.625], [0.0, 0.0]])
    # greedy takes the best pair first (P1→G2, 0.75) and leaves P2→G1 (0.375): total 1.125;
    # Hungarian: P1→G1 + P2→G2 = 0.5833 + 0.625 = 1.2083 > 1.125
    assert match(sim, "greedy") == [1, 0, -1]
    assert match(sim, "hungarian") == [0, 1, -1]
    assert call_rewards(pred, ref, "hungarian") == pytest.approx([7 / 12, 0.625, 0.0])
    assert call_rewards(pred, ref, "greedy") == pytest.approx([0.75, 0.375, 0.0])
    assert call_rewards(pred, ref, "hungarian", penalty=0.5) == pytest.approx([7 / 12, 0.625, -0.5])


def test_turn_rewards():
    # turn 0: one call 7/12; turn 1: calls 0.625 and 0 → mean 0.3125; turn 2: no call → 0;
    # turn 3 is the final answer → its F1
    assert turn_rewards([[7 / 12], [0.625, 0.0], [], []], 3, 6 / 7) == pytest.approx([7 / 12, 0.3125, 0.0, 6 / 7])
    assert turn_rewards([[1.0]], None, 0.9) == [1.0]
