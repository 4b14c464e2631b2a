"""bfcl_single: BFCL's single-turn entries from the installed bfcl-eval, its own tool conversion
and AST checker (imported with stand-ins for the SDKs it does not use), the split by id, the
loop's task options, and one rollout through the real proxy on the tiny model."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from harnessrl.app.rollouts.harnesses import TaskSource, load_harness
from harnessrl.errors import UserError
from harnessrl.harness_examples.bfcl_single import data
from harnessrl.harness_examples.bfcl_single.bfcl_imports import bfcl
from harnessrl.harness_examples.bfcl_single.checker import check

ROOT = Path(__file__).resolve().parents[1]

def _task(task_id: str) -> data.BfclSingleTask:
    return next(t for t in data.load_tasks() if t.id == task_id)


def _calls(calls: list[dict]) -> list[tuple[str, str]]:
    return [(c["name"], json.dumps(c["arguments"])) for c in calls]


@pytest.mark.unit
def test_loads_the_six_categories():
    counts = {c: len(data.load_tasks([c])) for c in data.CATEGORIES}
    assert counts == {"simple_python": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200,
                      "live_simple": 258, "live_multiple": 1053}
    task = data.load_tasks(["simple_python"])[0]
    assert task.messages == [{"role": "user", "content": "Find the area of a triangle with a base of 10 units "
                                                         "and height of 5 units."}]
    with pytest.raises(UserError, match="unknown BFCL category 'simple_java'"):
        data.load_tasks(["simple_java"])


@pytest.mark.unit
def test_split_by_id_is_disjoint_stable_and_the_same_for_every_seed():
    tasks = data.load_tasks()
    train_side, held_side = data.split(tasks)
    assert not {t.id for t in train_side} & {t.id for t in held_side}
    assert len(train_side) + len(held_side) == len(tasks) == 2311
    # pinned: a change to the hash or the bucket count would move ids between the sides
    assert len(held_side) == 436 and [t.id for t in held_side[:3]] == ["simple_python_0", "simple_python_3",
                                                                     "simple_python_9"]
    assert data.split(data.load_tasks()) == (train_side, held_side)
    runs = {seed: data.choose(tasks, 24, 0.25, seed) for seed in (0, 1)}
    for train, held in runs.values():
        assert len(train) == 18 and len(held) == 6
        assert not any(data.is_held_out(t.id) for t in train) and all(data.is_held_out(t.id) for t in held)
        assert {t.category for t in held} == set(data.CATEGORIES)  # a few tasks still cover every category
    assert runs[0][1] == runs[1][1] and runs[0][0] != runs[1][0]  # held-out: fixed; training: the seed's draw
    assert data.choose(tasks, 24, 0.25, 0) == runs[0]
    # what the accuracy bench scores: the whole held-out side, or each category's first ones in that order
    assert sorted(t.id for t in data.held_out()) == sorted(t.id for t in held_side)
    assert [t.id for t in data.held_out(["parallel"], 1)] == [t.id for t in runs[0][1] if t.category == "parallel"]


@pytest.mark.unit
def test_the_loop_s_task_options_are_honoured_or_refused(tmp_path):
    h = load_harness("bfcl_single", TaskSource(None, None, tmp_path, 8, 0.25, 3))
    assert len(h.train) == 6 and len(h.eval) == 2
    rows = [json.loads(line) for line in h.tasks_file.read_text().splitlines()]
    assert [r["id"] for r in rows] == [t.id for t in h.train + h.eval]
    assert rows[0]["tools"] == data.openai_tools(h.train[0]) and rows[0]["reference_calls"]
    for n, fraction in ((1, 0.25), (3000, 0.25), (8, 0.0)):
        with pytest.raises(UserError, match=f"--n-tasks {n}"):
            load_harness("bfcl_single", TaskSource(None, None, tmp_path, n, fraction, 0))
    # --tasks: the categories or ids to choose from
    pick = tmp_path / "pick.txt"
    pick.write_text("parallel\nlive_simple_0-0-0\n")
    h = load_harness("bfcl_single", TaskSource(pick, None, tmp_path, 4, 0.5, 0))
    assert {t.category for t in h.train + h.eval} <= {"parallel", "live_simple"} and len(h.eval) == 2
    pick.write_text("parallel_9999\n")
    with pytest.raises(UserError, match="'parallel_9999' is neither a BFCL category"):
        load_harness("bfcl_single", TaskSource(pick, None, tmp_path, 4, 0.5, 0))


@pytest.mark.unit
def test_tools_are_bfcl_s_own_openai_conversion():
    tools = data.openai_tools(_task("multiple_0"))  # "triangle_properties.get": "." is not allowed in OpenAI names
    assert [t["function"]["name"] for t in tools] == ["triangle_properties_get", "circle_properties_get"]
    fn = tools[0]["function"]
    assert fn["description"].endswith(" Note that the provided function is in Python 3 syntax.")
    assert fn["parameters"]["type"] == "object" and fn["parameters"]["required"] == ["side1", "side2", "side3"]
    text = json.dumps([data.openai_tools(t) for c in data.CATEGORIES for t in data.load_tasks([c])[:40]])
    for bfcl_only in ('"type": "dict"', '"type": "float"', '"type": "tuple"', '"type": "any"'):
        assert bfcl_only not in text
    floats = data.openai_tools(_task("simple_python_1"))  # BFCL marks a float as a number with format float
    assert '"format": "float"' in json.dumps(floats) or '"type": "number"' not in json.dumps(floats)
    # the shipped docs, which the checker reads, are left as they were
    assert _task("multiple_0").functions[0]["name"] == "triangle_properties.get"


@pytest.mark.unit
def test_bfcl_s_checker_is_imported_with_stand_ins_that_nothing_else_sees():
    b = bfcl()
    assert b.ast_checker.__module__ == "bfcl_eval.eval_checker.ast_eval.ast_checker"
    for name in b.stand_ins:  # only where the real module cannot be imported, and removed afterwards
        assert "harnessrl stand-in" not in (getattr(sys.modules.get(name), "__doc__", "") or "")


@pytest.mark.unit
def test_the_example_s_command_writes_the_chosen_tasks(tmp_path):
    from typer.testing import CliRunner

    from harnessrl.harness_examples.bfcl_single.__main__ import app

    out = tmp_path / "t.jsonl"
    for flags, held in ((["--categories", "parallel,live_simple"], False), (["--held-out"], True)):
        r = CliRunner().invoke(app, [*flags, "--n-tasks", "4", "--export-tasks", str(out)])
        assert r.exit_code == 0, r.output
        ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
        assert len(ids) == 4 and all(data.is_held_out(i) == held for i in ids)
    assert {i.split("_")[0] for i in ids} == {"simple", "multiple", "parallel"}  # categories in turn
    r = CliRunner().invoke(app, ["--n-tasks", "2"])
    assert r.exit_code != 0 and "--proxy URL is required" in str(r.exception or r.output)


# One real entry per category: BFCL's verdict on a right answer and on a wrong one.
WRONG = {
    "simple_python_0": ([{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 6}}],
                        "value_error:others"),
    "multiple_0": ([{"name": "circle_properties_get", "arguments": {"radius": 5}}], "wrong_func_name"),
    "parallel_0": ([{"name": "spotify_play", "arguments": {"artist": "Taylor Swift", "duration": 20}}],
                   "wrong_count"),
    "parallel_multiple_0": ([{"name": "math_toolkit_sum_of_multiples",
                              "arguments": {"lower_limit": 1, "upper_limit": 1000, "multiples": [3, 7]}},
                             {"name": "math_toolkit_product_of_primes", "arguments": {"count": 5}}],
                            "cannot_find_match"),
    "live_simple_0-0-0": ([{"name": "get_user_info", "arguments": {"user_id": "7890", "special": "black"}}],
                          "type_error:simple"),
    "live_multiple_0-0-0": ([{"name": "ChaDri_change_drink", "arguments": {"drink_id": "latte"}}],
                            "missing_required"),
}


@pytest.mark.unit
@pytest.mark.parametrize("task_id", list(WRONG))
def test_the_checker_scores_a_right_and_a_wrong_answer(task_id):
    task = _task(task_id)
    assert check(task, _calls(data.reference_calls(task)))["valid"]
    if task.category.startswith("parallel"):  # any order
        assert check(task, _calls(data.reference_calls(task)[::-1]))["valid"]
    wrong, error = WRONG[task_id]
    verdict = check(task, _calls(wrong))
    assert not verdict["valid"] and error in verdict["error_type"], verdict
    assert check(task, [])["error_type"].endswith("wrong_count")  # no call at all
    assert check(task, [(wrong[0]["name"], "{not json")])["error_type"] == "ast_decoder:decoder_failed"


@pytest.mark.unit
def test_every_reference_answer_passes_but_the_unanswerable_ones():
    failing = {t.id for t in data.load_tasks() if not check(t, _calls(data.reference_calls(t)))["valid"]}
    assert failing == data.UNANSWERABLE


@pytest.fixture(scope="module")
def rollout(tiny_model_dir, tmp_path_factory):
    from harnessrl.harness_examples.bfcl_single.harness import BfclSingleConfig, run_rollout
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    db = str(tmp_path_factory.mktemp("bfcl_single") / "runs.db")
    task = _task("simple_python_97")  # the shortest prompt with its tools
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0)) as p:
        result = run_rollout(p.url, task, BfclSingleConfig(max_tokens=24, temperature=0.0), run="t")
        report = _bench().evaluate(p.url, data.held_out(["simple_python", "parallel"], 1), max_tokens=16,
                                   concurrency=2, run="bench")
    return db, task, result, report


def _bench():
    spec = importlib.util.spec_from_file_location("bfcl_accuracy", ROOT / "bench" / "bfcl_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_rollout_through_the_proxy_reports_bfcl_s_verdict(rollout, tiny_model_dir):
    from sqlalchemy import select

    from harnessrl.db import open_db
    from harnessrl.records import Call, Reward

    db, task, result, _ = rollout
    _, make_session = open_db(db)
    with make_session() as s:
        calls = s.scalars(select(Call).where(Call.rollout_id == result.rollout_id)).all()
        rewards = s.scalars(select(Reward).where(Reward.rollout_id == result.rollout_id)).all()
    assert result.error is None and len(calls) == 1
    assert calls[0].request["messages"] == task.messages
    assert calls[0].request["tools"] == data.openai_tools(task)
    # and the tools reached the model: the recorded prompt holds them (never dropped silently)
    from transformers import AutoTokenizer

    from harnessrl.records import unpack_ids

    prompt = AutoTokenizer.from_pretrained(tiny_model_dir).decode(unpack_ids(calls[0].prompt_ids))
    assert all(t["function"]["name"] in prompt for t in data.openai_tools(task))
    assert [r.value for r in rewards if r.kind == "outcome"] == [result.outcome]
    # the recorded reply, scored again by BFCL's checker, gives the same verdict
    tool_calls = calls[0].response["choices"][0]["message"].get("tool_calls") or []
    verdict = check(task, [(c["function"]["name"], c["function"]["arguments"]) for c in tool_calls])
    assert result.outcome == float(verdict["valid"]) and result.metrics["tool_calls"] == len(tool_calls)


def test_the_accuracy_bench_reports_each_category_on_held_out_ids(rollout):
    from rich.console import Console

    report = rollout[3]
    assert report["categories"].keys() == {"simple_python", "parallel"}
    assert all(r["total"] == 1 and r["correct"] in (0, 1) for r in report["categories"].values())
    assert [e["id"] for e in report["entries"]] == [t.id for t in data.held_out(["simple_python", "parallel"], 1)]
    assert all(data.is_held_out(e["id"]) and (e["valid"] or ":" in e["verdict"]) for e in report["entries"])
    console = Console(width=120, record=True)
    console.print(_bench().table(report, "t"))
    assert "all (pooled)" in console.export_text() and "parallel_multiple" not in console.export_text()


def test_an_entry_whose_call_fails_on_our_side_is_counted_apart_and_the_rest_go_on():
    # a proxy that is not there: every call fails before the model answers (as a queued call that
    # times out on a loaded machine did, and ended the whole run); no entry is scored as the model's
    report = _bench().evaluate("http://127.0.0.1:9", data.held_out(["simple_python", "parallel"], 2), max_tokens=16,
                               concurrency=2, run="bench")
    assert report["categories"] == {"simple_python": {"correct": 0, "total": 0, "errors": 2},
                                    "parallel": {"correct": 0, "total": 0, "errors": 2}}
    assert all(e["error"] and not e["valid"] for e in report["entries"])
