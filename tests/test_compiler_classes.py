"""Token classes (docs/methods.md §3) on the tiny tokenizer's real ids, and response parsing."""

import numpy as np
import pytest

from harnessrl.compiler.labels import ClassConfig, batch_token_classes, label_bytes, token_classes
from harnessrl.compiler.response import parse_response
from harnessrl.compiler.tokentext import TokenText
from harnessrl.errors import UserError
from harnessrl.samples import ACTION as A
from harnessrl.samples import ARGS as G
from harnessrl.samples import FORMAT as F
from harnessrl.samples import REASONING as R


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def tt(tok):
    return TokenText(tok)


def test_decode_offsets_round_trip(tok, tt):
    text = 'é city <think>\nx\n</think>{"n": 3}<|im_end|>'
    ids = np.array(tok.encode(text, add_special_tokens=False), dtype=np.int32)
    raw, offsets = tt.decode(ids)
    assert raw.decode() == text
    assert offsets[0] == 0 and offsets[-1] == len(raw)
    # every token's byte span decodes (joined) to the same text
    assert b"".join(raw[a:b] for a, b in zip(offsets[:-1], offsets[1:])) == raw


PRIORITY = {A: 4, G: 3, R: 2, F: 1}


def check(tok, tt, segments, native=None):
    """`segments`: (text, class) pairs labelled by hand. The byte labels must match them, and
    every token must take the first of action > args > reasoning > format among its bytes
    (computed here token by token from the tokenizer's own offsets)."""
    text = "".join(s for s, _ in segments)
    want_bytes = [c for s, c in segments for _ in s.encode()]
    ids = np.array(tok.encode(text, add_special_tokens=False), dtype=np.int32)
    raw, offsets = tt.decode(ids)
    special = [(offsets[i], offsets[i + 1]) for i in np.flatnonzero(tt.special[ids])]
    assert label_bytes(raw, special, native).tolist() == want_bytes
    want_tokens = [max(want_bytes[a:b], key=PRIORITY.get) for a, b in zip(offsets[:-1], offsets[1:])]
    assert token_classes(ids, tt, native).tolist() == want_tokens


def test_hermes_tool_call_with_think(tok, tt):
    check(tok, tt, [
        ("<think>", F), ("\nI plan.\n", R), ("</think>", F), ("\n\n<tool_call>\n{\"name\": \"", F), ("search", A),
        ('", "arguments": {"key": "', F), ("é city", G), ('", "n": ', F), ("3", G), ("}}\n</tool_call>", F),
        ("<|im_end|>", F),
    ])


def test_dispatch_names_the_sub_agent_as_action_and_sub_task_as_args(tok, tt):
    check(tok, tt, [
        ('<tool_call>\n{"name": "', F), ("dispatch", A), ('", "arguments": {"agent": "', F), ("worker", A),
        ('", "task": "', F), ("find the capital", G), ('", "k": [', F), ("1", G), (", ", F), ("true", G),
        (']}}\n</tool_call>', F),
    ])


def test_matpo_xml(tok, tt):
    check(tok, tt, [
        ("<use_mcp_tool>\n<server_name>", F), ("search_agent", A), ("</server_name>\n<tool_name>", F),
        ("search", A), ('</tool_name>\n<arguments>\n{"query": "', F), ("river", G),
        ('"}\n</arguments>\n</use_mcp_tool>', F),
    ])


def test_answer_marker_and_boxed(tok, tt):
    check(tok, tt, [("I think so.", R), (" ", F), ("<answer>", A), ("Paris", G), ("</answer>", F), ("<|im_end|>", F)])
    check(tok, tt, [("So", R), (" ", F), ("\\boxed", A), ("{", F), ("4{2}", G), ("}", F), (" ", F), ("done", R)])


def test_boundary_token_takes_the_higher_class(tok, tt):
    # a space (format) followed by the first byte of the answer marker (action) inside one token:
    # whatever the vocabulary, some token here straddles two classes; check the rule on ids whose
    # bytes are known: " <" decoded from the ids of " " and "<answer>" merged by the tokenizer
    text = "ok <answer>x</answer>"
    ids = np.array(tok.encode(text, add_special_tokens=False), dtype=np.int32)
    raw, offsets = tt.decode(ids)
    marker = raw.index(b"<answer>")
    i = int(np.searchsorted(offsets, marker, side="right") - 1)  # the token holding the marker's first byte
    assert token_classes(ids, tt).tolist()[i] == A
    # and a token holding only free text before it is reasoning
    assert token_classes(ids, tt).tolist()[0] == R


def test_think_opened_by_the_template(tok, tt):
    # no call and no marker: the text after </think> is the final answer, args (docs/methods.md §3)
    check(tok, tt, [("plan first\n", R), ("</think>", F), ("\n\n", F), ("The answer is alpha.", G), ("<|im_end|>", F)])


def test_unmarked_final_answer_class_option(tok, tt):
    text = "plan first\n</think>\n\nThe answer is alpha.<|im_end|>"
    ids = np.array(tok.encode(text, add_special_tokens=False), dtype=np.int32)
    raw, offsets = tt.decode(ids)
    answer = slice(raw.index(b"The"), raw.index(b"<|im_end|>"))
    default = label_bytes(raw, [])
    assert set(default[answer].tolist()) == {G}
    assert set(label_bytes(raw, [], cfg=ClassConfig(unmarked_answer="reasoning"))[answer].tolist()) == {R}
    # without a think block the whole content is the answer; with a call it stays reasoning
    assert set(label_bytes(b"Paris", []).tolist()) == {G}
    calling = b'look it up <tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>'
    assert label_bytes(calling, [])[:10].tolist() == [R] * 10
    with pytest.raises(UserError, match="unmarked answer class 'final'"):
        ClassConfig(unmarked_answer="final")


def test_native_tool_calls_found_in_raw_text(tok, tt):
    native = [{"id": "x", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "alpha"}'}}]
    check(tok, tt, [("call", R), (" ", F), ("lookup", A), (" ", F), ("with key=", R), ("alpha", G),
                    ("<|im_end|>", F)], native)


def test_nested_arguments_and_the_lexer_agree(tok, tt):
    # the fast path ({"name", "arguments"} in that order) and the lexer (other key order) label
    # the same values: strings' insides, numbers and literals are args; keys and syntax format
    check(tok, tt, [('<tool_call>\n{"name": "', F), ("search", A), ('", "arguments": {"q": "', F), ('a \\"b\\"', G),
                    ('", "opts": {"k": [', F), ("1", G), (', "', F), ("x", G), ('"]}, "f": ', F), ("false", G),
                    ("}}\n</tool_call>", F)])
    check(tok, tt, [('<tool_call>\n{"arguments": {"q": "', F), ("a", G), ('"}, "name": "', F), ("search", A),
                    ('"}\n</tool_call>', F)])


def test_batch_equals_one_by_one(tok, tt):
    texts = ['<think>\nhm', '<tool_call>\n{"name": "a", "arguments": {"k": "v"', "\\boxed{12", "plain</think> x",
             "ok <answer>y</answer>", "", "call lookup now"]
    natives = [None, None, None, None, None, None,
               [{"type": "function", "function": {"name": "lookup", "arguments": "{}"}}]]
    comps = [np.array(tok.encode(t, add_special_tokens=False), dtype=np.int32) for t in texts]
    batch = batch_token_classes(comps, tt, natives)
    single = [token_classes(c, tt, n) for c, n in zip(comps, natives)]
    assert [b.tolist() for b in batch] == [x.tolist() for x in single]
    # unterminated spans stop at their own completion: "\\boxed{12" is action/format/args,
    # and the next completion starts as free text
    assert batch[3][0] == R and batch[2][-1] == G
    # a completion holding a NUL byte is labelled on its own, the others still in one batch
    odd = np.array(tok.encode("x\x00 <answer>y</answer>", add_special_tokens=False), dtype=np.int32)
    mixed = batch_token_classes([comps[4], odd, comps[6]], tt, [None, None, natives[6]])
    assert [m.tolist() for m in mixed] == [single[4].tolist(), token_classes(odd, tt).tolist(), single[6].tolist()]
    assert A in mixed[1].tolist() and G in mixed[1].tolist()


def test_parse_response():
    p = parse_response('<think>x</think><tool_call>\n{"name": "a", "arguments": {"k": 1}}\n</tool_call>'
                       '<tool_call>\n{"name": "b", "arguments": "{\\"q\\": \\"v\\"}"}\n</tool_call>'
                       '<tool_call>\nnot json\n</tool_call>')
    assert [(c.name, c.arguments) for c in p.calls] == [("a", {"k": 1}), ("b", {"q": "v"}), (None, None)]
    native = [{"type": "function", "function": {"name": "s", "arguments": "{bad"}}]
    assert [(c.name, c.arguments) for c in parse_response("", native).calls] == [("s", None)]
    assert parse_response("<think>hm</think>So it is \\boxed{4{2}}.").answer == "4{2}"
    assert parse_response("x <answer> Paris </answer>").answer == "Paris"
    assert parse_response("<think>hm</think>\n\nParis<|im_end|>").answer == "Paris"
    mcp = parse_response("<use_mcp_tool><server_name>s</server_name><tool_name>t</tool_name>"
                         '<arguments>{"a": 1}</arguments></use_mcp_tool>')
    assert [(c.name, c.arguments) for c in mcp.calls] == [("t", {"a": 1})]
