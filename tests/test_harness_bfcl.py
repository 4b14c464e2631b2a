"""bfcl_multiturn: BFCL data and back-ends from the installed bfcl-eval, ground-truth execution,
BFCL's state check, reference calls / expert traces / task export, and rollouts through the
real proxy on the tiny model (state-check outcome in the DB, reference calls for MatchTIR)."""

from __future__ import annotations

import json

import pytest

from harnessrl.errors import UserError
from harnessrl.harness_examples.bfcl_multiturn.data import (
    ADDED_FUNCTIONS_PROMPT,
    Backends,
    expert_trace,
    export_tasks,
    function_docs,
    load_tasks,
    openai_tools,
    parse_call,
    reference_calls,
    state_check,
)
from harnessrl.harness_examples.bfcl_multiturn.harness import _execute
from harnessrl.harness_examples.chat import ToolCall

TRADING = "multi_turn_base_105"  # TradingBot only; the smallest prompt (~3k tiny-model tokens)


def _replay(task, backends, upto=None):
    for turn in task.ground_truth[:upto]:
        for text in turn:
            backends.run(text)


def test_loads_the_packaged_categories():
    base = load_tasks("multi_turn_base")
    assert len(base) == 200 and base[0].id == "multi_turn_base_0"
    assert len(base[0].turns) == len(base[0].ground_truth) == 4
    with pytest.raises(UserError, match="unknown BFCL category"):
        load_tasks("multi_turn_nope")
    with pytest.raises(UserError, match="no BFCL task"):
        load_tasks(ids=["multi_turn_base_9999"])


def test_ground_truth_replays_to_the_same_state_and_deviations_are_caught():
    task = load_tasks(ids=[TRADING])[0]
    truth, same = Backends(task), Backends(task)
    _replay(task, truth)
    _replay(task, same)
    assert state_check(same, truth) == (True, {})
    # All but the last watchlist addition: the watchlist differs, and the check names it.
    short = Backends(task)
    for text in [c for turn in task.ground_truth for c in turn][:-1]:
        short.run(text)
    valid, diff = state_check(short, truth)
    assert not valid and set(diff) == {"watch_list"}
    assert diff["watch_list"]["ground_truth"] == ["NVDA", "AAPL", "GOOG", "MSFT"]


def test_agent_side_execution_of_reference_calls_passes_the_state_check():
    """What the harness runs for a model's tool calls (named JSON arguments) reproduces the truth."""
    task = load_tasks(ids=["multi_turn_base_0"])[0]  # file system + posting, positional `sort('…')`
    truth, agent = Backends(task), Backends(task)
    _replay(task, truth)
    allowed = {d["name"] for d in function_docs(task, 0)}
    for n, call in enumerate(reference_calls(task)):
        _, ok = _execute(agent, ToolCall(str(n), call["name"], json.dumps(call["arguments"]), call["arguments"]), allowed)
        assert ok, call
    assert state_check(agent, truth)[0]
    text, ok = _execute(agent, ToolCall("x", "cp", "{}", {}), allowed)  # excluded in this task
    assert not ok and "unknown function 'cp'" in text
    text, ok = _execute(agent, ToolCall("y", "cd", "{}", {}), allowed)
    assert not ok and text.startswith("Error during execution")


def test_reference_calls_name_positional_arguments():
    task = load_tasks(ids=["multi_turn_base_0"])[0]
    calls = reference_calls(task)
    flat = [c for turn in task.ground_truth for c in turn]
    assert len(calls) == len(flat) == 10
    assert calls[0] == {"name": "cd", "arguments": {"folder": "document"}}
    assert flat[5] == "sort('final_report.pdf')" and calls[5] == {"name": "sort", "arguments": {"file_name": "final_report.pdf"}}
    assert parse_call("f(1, x=[2, 'a'])") == ("f", [1], {"x": [2, "a"]})
    with pytest.raises(ValueError):
        parse_call("os.system('ls')")


def test_expert_trace_and_export(tmp_path):
    task = load_tasks(ids=[TRADING])[0]
    trace = expert_trace(task)
    assert [m["role"] for m in trace] == ["user", "assistant", "tool", "user"] + ["assistant", "tool"] * 4
    assert json.loads(trace[1]["tool_calls"][0]["function"]["arguments"]) == {"symbol": "QUAS"}
    assert json.loads(trace[4 + 1]["content"]) == {"stock_list": ["AAPL", "GOOG", "MSFT", "NVDA"]}  # executed result
    assert trace[-1]["content"] == '{"watchlist": ["NVDA", "AAPL", "GOOG", "MSFT"]}'
    out = tmp_path / "bfcl.jsonl"
    assert export_tasks(load_tasks(limit=3), out) == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2"]
    assert rows[0]["input"][0]["role"] == "user" and len(rows[0]["input"]) == 4
    assert rows[0]["reference_calls"] == reference_calls(load_tasks(limit=1)[0])
    assert set(rows[0]) == {"id", "input", "reference", "reference_calls", "expert_trace", "meta"}


def test_tool_schemas_and_held_out_functions():
    task = load_tasks("multi_turn_miss_func", limit=1)[0]
    assert task.missed_functions == {3: ["sort"]} and task.turns[3] == []
    names = [[d["name"] for d in function_docs(task, t)] for t in range(len(task.turns))]
    assert "sort" not in names[2] and "sort" in names[3] and "cp" not in names[3]
    assert task.user_messages(3) == [{"role": "user", "content": ADDED_FUNCTIONS_PROMPT}]
    text = json.dumps(openai_tools(function_docs(task, 3)))
    for bfcl_only in ('"type": "dict"', '"type": "float"', '"type": "tuple"', '"type": "any"', '"response"'):
        assert bfcl_only not in text
    assert '"type": "object"' in text


@pytest.fixture(scope="module")
def bfcl_rollout(tiny_model_dir, tmp_path_factory):
    from harnessrl.harness_examples.bfcl_multiturn.harness import BfclConfig, run_rollout
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    db = str(tmp_path_factory.mktemp("bfcl") / "runs.db")
    task = load_tasks(ids=[TRADING])[0]
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0)) as p:
        result = run_rollout(p.url, task, BfclConfig(max_steps_per_turn=2, max_tokens=32))
    return db, task, result


def test_rollout_through_the_proxy_reports_the_state_check(bfcl_rollout):
    from sqlalchemy import select

    from harnessrl.db import open_db
    from harnessrl.records import Call, Reward

    db, task, result = bfcl_rollout
    _, make_session = open_db(db)
    with make_session() as s:
        calls = s.scalars(select(Call).where(Call.rollout_id == result.rollout_id).order_by(Call.seq)).all()
        rewards = s.scalars(select(Reward).where(Reward.rollout_id == result.rollout_id)).all()
    assert result.error is None
    assert len(calls) == result.metrics["model_calls"] >= 2  # at least one call per user turn
    assert result.metrics["turns_checked"] == 2
    assert result.outcome == float(result.metrics["turns_passed"] == 2)
    outcome = [r.value for r in rewards if r.kind == "outcome"]
    assert outcome == [result.outcome]
    # The user turns arrive in order, the second after the first turn's calls.
    firsts = [c for c in calls if c.request["messages"][-1]["role"] == "user"]
    assert [c.request["messages"][-1]["content"] for c in firsts] == [t[0]["content"] for t in task.turns]
    tool_ok = [r for r in rewards if r.kind == "process"]
    assert all(r.name == "tool_ok" and 0.0 <= r.value <= 1.0 and r.call_id in {c.id for c in calls} for r in tool_ok)
    assert len(tool_ok) == sum(bool(c.response["choices"][0]["message"].get("tool_calls")) for c in calls)


def test_matchtir_rewards_against_the_ground_truth(bfcl_rollout, tmp_path):
    from harnessrl.compiler import matchtir
    from harnessrl.compiler.tasks import import_tasks
    from harnessrl.db import open_db
    from harnessrl.records import Call, Task
    from sqlalchemy import select

    db, task, result = bfcl_rollout
    path = tmp_path / "bfcl.jsonl"
    export_tasks([task], path)
    assert import_tasks(db, path) == (1, 1)
    _, make_session = open_db(db)
    with make_session() as s:
        ref = matchtir.reference_calls(s.get(Task, task.id).reference_calls)
        calls = s.scalars(select(Call).where(Call.rollout_id == result.rollout_id).order_by(Call.seq)).all()
    assert ref[0] == ("get_stock_info", {"symbol": "QUAS"}) and len(ref) == 5
    # The ground truth scored against itself: every S_ab = (1 + 1 + |G_b|) / (2 + |G_b|) = 1.
    assert matchtir.call_rewards(ref, ref) == [1.0] * 5
    # A right name with a wrong value: (1 + jaccard 1 + 0 exact) / (2 + 1) = 2/3; an unknown name: 0.
    assert matchtir.call_rewards([("add_to_watchlist", {"stock": "NVDA"}), ("nope", {})], ref) == [
        pytest.approx(2 / 3), 0.0]
    predicted = []
    for c in calls:
        for tc in c.response["choices"][0]["message"].get("tool_calls") or []:
            try:
                args = json.loads(tc["function"]["arguments"])
            except ValueError:
                args = None
            predicted.append((tc["function"]["name"], args if isinstance(args, dict) else None))
    rewards = matchtir.call_rewards(predicted, ref)
    assert len(rewards) == len(predicted) and all(0.0 <= r <= 1.0 for r in rewards)

    # The compiler turns the same records into PACT samples with MatchTIR turn rewards.
    from harnessrl.compiler.pipeline import CompileOptions, Compiler

    stats = Compiler(db, CompileOptions(out=tmp_path / "out", advantage="matchtir", process=("matchtir",))).run()["totals"]
    assert stats["rollouts"] == 1 and stats["calls"] == len(calls) and stats["failed"] == 0 and stats["samples"] >= 1
