"""The everyday-assistant family: real words, a deterministic split whose held-out tasks are tool ×
name pairs never trained on, the call judged by tool and argument, and a rollout through a real
proxy recorded with its tools and its reward."""

from __future__ import annotations

import pytest

from harnessrl.harness_examples.assistant import tasks as assistant


@pytest.mark.unit
def test_split_holds_out_new_pairs_of_seen_tools_and_names(tmp_path):
    train, held = assistant.generate(0)
    assert (train, held) == assistant.generate(0) and train != assistant.generate(1)[0]
    assert (len(train), len(held)) == (72, 36)
    pairs = lambda ts: {(t.tool, t.entity) for t in ts}  # noqa: E731
    assert not pairs(train) & pairs(held)
    assert {t.entity for t in held} <= {t.entity for t in train}
    assert {t.tool for t in held} == {t.tool for t in train} == set(assistant.TOOLS_SPEC)
    assert assistant.read(assistant.write(train + held, tmp_path / "t.jsonl")) == train + held
    task = next(t for t in held if t.tool == "get_price")
    assert task.entity in task.question and task.row()["reference_calls"] == [
        {"name": "get_price", "arguments": {"product": task.entity}}]


@pytest.mark.unit
def test_a_call_is_judged_by_its_tool_and_its_argument():
    task = assistant.AssistantTask("t", "get_phone", "Liam O'Brien", 0)
    assert task.right("get_phone", {"name": "liam o'brien "}) == (True, True)  # case and space do not matter
    assert task.right("get_email", {"name": "Liam O'Brien"}) == (False, True)
    assert task.right("get_phone", {"person": "Liam O'Brien"}) == (True, False)  # the schema's parameter name
    assert task.right("get_phone", {"name": "Liam"}) == (True, False)
    assert task.right("get_phone", None) == (True, False)
    assert assistant.AssistantTask("p", "get_price", "Echo Dot", 1).right("get_price", {"product": "the Echo Dot"}) \
        == (True, True)


@pytest.mark.unit
def test_the_inconsistent_expert_calls_the_asked_tool_two_times_in_five():
    import json

    task = assistant.AssistantTask("t", "get_reviews", "Roomba", 1)
    rows = assistant.inconsistent_expert([task], traces=5, right=2)
    called = [r["expert_trace"][0]["tool_calls"][0]["function"] for r in rows]
    # two right lines, three of the same kind's confused tool; every line the right argument, its own
    # tool's result, and the task itself (question, tools) unchanged
    assert [c["name"] for c in called] == ["get_reviews"] * 2 + ["check_stock"] * 3
    assert all(json.loads(c["arguments"]) == {"product": "Roomba"} for c in called)
    assert rows[2]["expert_trace"][1]["content"] == assistant.result("check_stock", "Roomba")
    assert all(r["input"] == task.messages() and r["id"] == "t" and r["tools"] == assistant.TOOLS for r in rows)
    assert set(assistant.CONFUSE) == set(assistant.CONFUSE.values()) == set(assistant.TOOLS_SPEC)  # a cycle over all nine
    assert all(assistant.TOOLS_SPEC[a][0] == assistant.TOOLS_SPEC[b][0] and a != b for a, b in assistant.CONFUSE.items())
    with pytest.raises(ValueError):
        assistant.inconsistent_expert([task], traces=2, right=3)

def test_rollout_through_the_proxy_records_the_tools_and_the_reward(tmp_path, tiny_model_dir):
    from harnessrl.app.rollouts.harnesses import TaskSource, load_harness
    from harnessrl.db import open_db
    from harnessrl.proxy.server import ProxyConfig, run_proxy
    from harnessrl.records import Call, Reward

    h = load_harness("assistant", TaskSource(None, None, tmp_path, 4, 0.5, 0))
    assert (len(h.train), len(h.eval)) == (2, 2)
    db = str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0)) as proxy:
        result = h.run(proxy.url, h.train[0], "g0", "r0", 1.0)
    _, Session = open_db(db)
    with Session() as s:
        (call,) = s.query(Call).all()
        (reward,) = s.query(Reward).all()
    assert [t["function"]["name"] for t in call.request["tools"]] == list(assistant.TOOLS_SPEC)
    assert reward.value == result.outcome == result.metrics["success"]
    assert result.metrics["success"] == result.metrics["right_tool"] * result.metrics["right_item"]
