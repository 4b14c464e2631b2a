"""The toolbox task family (the learning benchmark's): a deterministic world and split, expert
traces that call the right tool, and both variants run through a real proxy."""

import json

import pytest
from sqlalchemy import select

from harnessrl.app.harnesses import TaskSource, load_harness
from harnessrl.db import open_db
from harnessrl.harness_examples.toolbox import tasks as toolbox
from harnessrl.records import Call, Reward, Rollout


@pytest.mark.unit
def test_split_is_deterministic_and_holds_out_new_combinations_of_seen_parts():
    train, held = toolbox.generate(3)
    assert (train, held) == toolbox.generate(3) and train != toolbox.generate(4)[0]
    assert len(train) == len(held) == 64
    pairs = lambda ts: {(t.item, t.attribute) for t in ts}  # noqa: E731
    assert not pairs(train) & pairs(held)
    assert {t.item for t in held} <= {t.item for t in train}
    assert {t.attribute for t in held} == {t.attribute for t in train} == set(toolbox.ATTRIBUTES)
    table = toolbox.world(3)
    assert all(t.value == table[(t.item, t.attribute)] for t in train + held)


@pytest.mark.unit
def test_rows_carry_the_right_call_and_delegated_sft_adds_the_workers(tmp_path):
    task = toolbox.generate(0)[0][0]
    row = task.row()
    call = row["expert_trace"][0]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == (f"get_{task.attribute}", {"item": task.item})
    assert row["reference_calls"] == [{"name": f"get_{task.attribute}", "arguments": {"item": task.item}}]
    assert toolbox.read(toolbox.write([task], tmp_path / "t.jsonl")) == [task]
    d_train, _ = toolbox.generate(0, delegate=True)
    lines = toolbox.write(d_train, tmp_path / "sft.jsonl", sft=True).read_text().splitlines()
    assert len(lines) == 128
    planner, worker = json.loads(lines[0]), json.loads(lines[64])
    assert planner["tools"] == [toolbox.ASK_WORKER] and planner["reference_calls"][0]["name"] == "ask_worker"
    assert worker["tools"] == toolbox.TOOLS and worker["input"][1]["content"] == d_train[0].question


@pytest.mark.parametrize("name,agent", [("toolbox", "agent"), ("toolbox_delegate", "planner")])
def test_toolbox_rollout_through_the_proxy(tmp_path, tiny_model_dir, name, agent):
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    h = load_harness(name, TaskSource(None, None, tmp_path, 0, 0.5, 0))
    assert (len(h.train), len(h.eval)) == (64, 64)
    db = str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0)) as proxy:
        result = h.run(proxy.url, h.train[0], "g", "round-0", 0.0)
    assert result.task_id == h.train[0].id and result.outcome in (0.0, 1.0)
    _, Session = open_db(db)
    with Session() as s:
        rollout = s.scalars(select(Rollout).where(Rollout.run == "round-0")).one()
        calls = s.scalars(select(Call).where(Call.rollout_id == rollout.id).order_by(Call.seq)).all()
        assert calls and calls[0].agent == agent and all(c.status == "ok" for c in calls)
        assert s.scalars(select(Reward.value).where(Reward.rollout_id == rollout.id)).one() == result.outcome


@pytest.mark.unit
def test_sft_copies_keep_the_calls_and_change_the_values():
    train, _ = toolbox.generate(0)
    copies = toolbox.sft_tasks(train, 3, 0)
    assert copies[:64] == train and len(copies) == 256
    for w in range(1, 4):
        block = copies[64 * w: 64 * (w + 1)]
        assert [(t.item, t.attribute) for t in block] == [(t.item, t.attribute) for t in train]
    assert sum(a.value != b.value for a, b in zip(train, copies[64:128])) > 32  # mostly other values


@pytest.mark.unit
def test_training_rounds_see_fresh_worlds_and_evaluation_the_seeds():
    a, b = toolbox.training_world(0, "round-0-a1"), toolbox.training_world(0, "round-1-a2")
    assert a == toolbox.training_world(0, "round-0-a1") and a != b and a != toolbox.world(0)
    assert a.keys() == toolbox.world(0).keys()
