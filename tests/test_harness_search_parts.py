"""The search examples' offline parts: BM25 (against hand-computed scores), answer metrics,
the fictional world's multi-hop structure, real-corpus loading, the calculator and tool parsing."""

from __future__ import annotations

import json
import math

import pytest

from harnessrl.errors import UserError
from harnessrl.harness_examples.bm25 import BM25Index
from harnessrl.harness_examples.chat import ToolCall, run_tool
from harnessrl.harness_examples.fictional_world import generate_world
from harnessrl.harness_examples.calculator import calculator
from harnessrl.harness_examples.search_task import SearchEnv, export_tasks, load_search_tasks
from harnessrl.harness_examples.text_metrics import extract_answer
from harnessrl.answer_match import exact_match, f1


def test_bm25_matches_hand_computation():
    index = BM25Index(["a b", "a c c", "d"])  # N=3, |d|=2,3,1, avgdl=2, k1=1.5, b=0.75
    # "c": df=1, idf=ln(1+2.5/1.5)=ln(2.6667)=0.980829; d1: tf=2, norm=1.5*(0.25+0.75*3/2)=2.0625
    #      score = 0.980829*2*2.5/(2+2.0625) = 1.207174
    assert index.top_k("c") == [(1, pytest.approx(1.207174, abs=1e-5))]
    # "a": df=2, idf=ln(1+1.5/2.5)=ln(1.6)=0.470004; d0: norm=1.5 → 0.470004*2.5/2.5 = 0.470004;
    #      d1: 0.470004*2.5/(1+2.0625) = 0.383677; d2 has no "a" and is not returned
    hits = index.top_k("A!", k=5)
    assert [i for i, _ in hits] == [0, 1]
    assert hits[0][1] == pytest.approx(0.470004, abs=1e-5) and hits[1][1] == pytest.approx(0.383677, abs=1e-5)
    assert index.top_k("zzz") == []
    assert index.idf["a"] == pytest.approx(math.log(1.6))


def test_answer_metrics():
    assert exact_match("The Stavax.", ["stavax"]) == 1.0
    assert exact_match("Stavax city", ["Stavax"]) == 0.0
    # "stavax city" vs "stavax": 1 common token, precision 1/2, recall 1 → F1 = 2*0.5*1/1.5 = 2/3
    assert f1("the Stavax city", ["Nowhere", "Stavax"]) == pytest.approx(2 / 3)
    assert f1("", ["Stavax"]) == 0.0
    assert extract_answer("<think>maybe <answer>x</answer></think> <answer> Drell </answer>") == "Drell"
    assert extract_answer("<think>hmm</think>Drell") == "Drell"
    assert extract_answer(None) == ""


def test_world_is_deterministic_and_multi_hop():
    docs, qas = generate_world(seed=3)
    assert (docs, [q.question for q in qas]) == (lambda d, q: (d, [x.question for x in q]))(*generate_world(seed=3))
    assert [d.text for d in generate_world(seed=4)[0]] != [d.text for d in docs]
    by_id = {d.id: d for d in docs}
    assert {q.meta["hops"] for q in qas} == {2, 3}
    for qa in qas:
        chain = [by_id[s] for s in qa.meta["support"]]
        assert len(chain) == qa.meta["hops"]
        assert chain[0].title in qa.question
        for prev, nxt in zip(chain, chain[1:]):  # each hop's entity is named by the previous document
            assert nxt.title in prev.text
        assert qa.answers[0] in chain[-1].text and qa.answers[0] not in qa.question


def test_search_env_finds_the_first_hop():
    tasks = load_search_tasks(seed=0)
    for qa in tasks.tasks[:6]:
        first = next(d for d in tasks.env.docs if d.id == qa.meta["support"][0])
        assert f"{first.title}: {first.text}" in tasks.env.search(qa.question)
    with pytest.raises(ValueError):
        tasks.env.search("  ")


def test_real_corpus_and_qa_files(tmp_path):
    corpus, qa = tmp_path / "c.jsonl", tmp_path / "qa.jsonl"
    corpus.write_text('{"id": "d1", "title": "Oslo", "text": "Oslo is the capital of Norway."}\n'
                      '{"contents": "Paris is in France."}\n')
    qa.write_text('{"id": "q1", "question": "Capital of Norway?", "answer": "Oslo"}\n'
                  '{"question": "Where is Paris?", "golden_answers": ["France"]}\n')
    tasks = load_search_tasks(corpus, qa)
    assert [t.answers for t in tasks.tasks] == [["Oslo"], ["France"]]
    assert tasks.env.search("norway capital").startswith("[1] Oslo: Oslo is the capital")
    out = tmp_path / "tasks.jsonl"
    assert export_tasks(tasks.tasks, out) == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0] == {"id": "q1", "input": "Capital of Norway?", "reference": ["Oslo"], "meta": {}}
    with pytest.raises(UserError, match="both"):
        load_search_tasks(corpus, None)
    qa.write_text('{"question": "no answer"}\n')
    with pytest.raises(UserError, match="row 1"):
        load_search_tasks(corpus, qa)
    qa.write_text("not json\n")
    with pytest.raises(UserError, match="not JSON"):
        load_search_tasks(corpus, qa)
    with pytest.raises(UserError):
        SearchEnv([])


def test_calculator_is_arithmetic_only():
    assert calculator("(3 + 4) * 2") == "14"
    assert calculator("7 / 2") == "3.5"
    assert calculator("-2 ** 3 % 5") == "2"  # -(2**3) % 5 = -8 % 5 = 2
    for bad in ("__import__('os')", "2 ** 1000", "x + 1", "1 +"):
        with pytest.raises(ValueError):
            calculator(bad)


def test_run_tool_turns_garbage_into_messages():
    tools = {"calculator": calculator}
    assert run_tool(ToolCall("1", "calculator", '{"expression": "1+1"}', {"expression": "1+1"}), tools) == ("2", True)
    text, ok = run_tool(ToolCall("2", "nope", "{}", {}), tools)
    assert not ok and "unknown tool 'nope'" in text
    text, ok = run_tool(ToolCall("3", "calculator", "{", None, "arguments are not valid JSON"), tools)
    assert not ok and "not valid JSON" in text
    text, ok = run_tool(ToolCall("4", "calculator", '{"expr": "1"}', {"expr": "1"}), tools)
    assert not ok and "bad arguments" in text
    text, ok = run_tool(ToolCall("5", "calculator", '{"expression": "1/0"}', {"expression": "1/0"}), tools)
    assert not ok and text.startswith("Error")
