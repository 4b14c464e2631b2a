"""The toolbox task family (the learning benchmark's): a deterministic world and split, expert
traces that call the right tool and end there, and both variants run through a real proxy, where
the first tool call that runs ends the episode and is scored against the task's reference."""

import json

import pytest
from sqlalchemy import select

from harnessrl.app.rollouts.harnesses import TaskSource, load_harness
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
@pytest.mark.parametrize("name", ["toolbox", "toolbox_delegate", "multihop", "toolbox_sparse"])
def test_n_tasks_is_honoured_or_refused_never_ignored(tmp_path, name):
    from harnessrl.errors import UserError

    for d in ("full", "cut", "again"):
        (tmp_path / d).mkdir()
    full = load_harness(name, TaskSource(None, None, tmp_path / "full", None, 0.5, 0))
    h = load_harness(name, TaskSource(None, None, tmp_path / "cut", 4, 0.25, 0))
    # 4 in all, a quarter held out: each side the first of the family's own split
    assert [t.id for t in h.train] == [t.id for t in full.train[:3]]
    assert [t.id for t in h.eval] == [t.id for t in full.eval[:1]]
    for n in (1, 200):
        with pytest.raises(UserError, match=f"--n-tasks {n}"):
            load_harness(name, TaskSource(None, None, tmp_path / "cut", n, 0.25, 0))
    # a written tasks file: its first --n-tasks, split by --eval-fraction
    h = load_harness(name, TaskSource(full.tasks_file, None, tmp_path / "again", 6, 0.5, 0))
    assert len(h.train) == 3 and len(h.eval) == 3


@pytest.mark.unit
def test_rows_carry_the_right_call_and_delegated_sft_adds_the_workers(tmp_path):
    task = toolbox.generate(0)[0][0]
    row = task.row()
    call = row["expert_trace"][0]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == (f"get_{task.attribute}", {"item": task.item})
    assert row["reference_calls"] == [{"name": f"get_{task.attribute}", "arguments": {"item": task.item}}]
    # the episode ends at the call: the trace ends with its result, no trained answer turn after it
    assert [m["role"] for m in row["expert_trace"]] == ["assistant", "tool"]
    assert row["expert_trace"][-1]["content"] == task.value
    assert toolbox.read(toolbox.write([task], tmp_path / "t.jsonl")) == [task]
    d_train, _ = toolbox.generate(0, delegate=True)
    lines = toolbox.write(d_train, tmp_path / "sft.jsonl", sft=True).read_text().splitlines()
    assert len(lines) == 128
    planner, worker = json.loads(lines[0]), json.loads(lines[64])
    assert planner["tools"] == [toolbox.ASK_WORKER] and planner["reference_calls"][0]["name"] == "ask_worker"
    assert worker["tools"] == toolbox.TOOLS and worker["input"][1]["content"] == d_train[0].question


@pytest.mark.unit
def test_inconsistent_expert_mixes_the_confused_tool_into_each_confused_task(tmp_path):
    train, _ = toolbox.generate(0)
    table = toolbox.world(0)
    rows = toolbox.inconsistent_expert(train, table, {"size": "color"}, traces=3, right=1)
    assert len(rows) == 3 * 64
    for t in train:
        mine = [r for r in rows if r["id"] == t.id]
        calls = [r["expert_trace"][0]["tool_calls"][0]["function"] for r in mine]
        assert all(json.loads(c["arguments"]) == {"item": t.item} for c in calls)
        # every line is a real episode: the called tool's result is that attribute's value in the world
        called = [c["name"].removeprefix("get_") for c in calls]
        assert [r["expert_trace"][1]["content"] for r in mine] == [table[(t.item, a)] for a in called]
        assert called == ([t.attribute, "color", "color"] if t.attribute == "size" else [t.attribute] * 3)
        # the reference stays the right call: only the demonstration is wrong
        assert all(r["reference_calls"][0]["name"] == f"get_{t.attribute}" for r in mine)
    d_train, _ = toolbox.generate(0, delegate=True)
    d_rows = toolbox.inconsistent_expert(d_train[:2], table, {"size": "color"}, traces=2, right=1)
    assert [r["tools"] for r in d_rows] == [toolbox.TOOLS] * 2 + [[toolbox.ASK_WORKER]] + [toolbox.TOOLS] * 2 + [[toolbox.ASK_WORKER]]
    with pytest.raises(ValueError):
        toolbox.inconsistent_expert(train, table, {"size": "weight"})
    drill = toolbox.copy_drill()
    assert len(drill) == 2 * len(toolbox.ITEMS)
    for r in drill:
        call = r["expert_trace"][0]["tool_calls"][0]["function"]
        assert call["name"] == "find" and json.loads(call["arguments"]) == {"item": r["meta"]["item"]}
        assert r["meta"]["item"] in r["input"][1]["content"]


@pytest.mark.parametrize("name,agent", [("toolbox", "agent"), ("toolbox_delegate", "planner")])
def test_toolbox_rollout_through_the_proxy(tmp_path, tiny_model_dir, name, agent):
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    h = load_harness(name, TaskSource(None, None, tmp_path, None, 0.5, 0))
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
def test_training_rounds_see_fresh_worlds_and_evaluation_the_seeds():
    a, b = toolbox.training_world(0, "round-0-a1"), toolbox.training_world(0, "round-1-a2")
    assert a == toolbox.training_world(0, "round-0-a1") and a != b and a != toolbox.world(0)
    assert a.keys() == toolbox.world(0).keys()


def test_the_first_tool_call_that_runs_ends_the_episode(tmp_path, tiny_model_dir):
    """tool_loop's answer_from_tool, with the tiny model (which calls `lookup` and then answers a
    tool result with text): off, the episode goes on to that text; on, it ends at the call."""
    from harnessrl.client import HarnessRL
    from harnessrl.harness_examples.chat import make_client, tool_loop
    from harnessrl.harness_examples.lookup.tasks import LOOKUP_TOOL
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    with run_proxy(ProxyConfig(db=str(tmp_path / "runs.db"), backend="local", model=str(tiny_model_dir),
                               port=0)) as proxy:
        hrl = HarnessRL(proxy.url)
        for from_tool in (False, True):
            messages = [{"role": "user", "content": "What is the capital of paris?"}]
            with hrl.rollout(task_id="t") as ro, make_client(ro.base_url("agent"), f"hrl-{ro.id}-agent") as client:
                answer, error, counts = tool_loop(client, None, messages, [LOOKUP_TOOL],
                                                  {"lookup": lambda query: f"value of {query}"}, max_turns=3,
                                                  max_tokens=40, temperature=0.0, answer_from_tool=from_tool)
            assert error is None and counts["tool_calls"] >= 1
            if from_tool:
                assert counts == {"model_calls": 1, "tool_calls": 1, "tool_errors": 0}
                assert messages[-1]["role"] == "tool" and answer == messages[-1]["content"].strip()
                assert answer.startswith("value of ")
            else:
                assert counts["model_calls"] >= 2 and messages[-1]["role"] == "assistant"
                assert not answer.startswith("value of ")


@pytest.fixture(scope="module")
def toolbox_model(tiny_model_dir, tmp_path_factory):
    """The tiny model fitted (80 SFT steps, ~15 s) to one solo task's and one delegated task's
    expert traces, so that greedy it makes the right call for them — a successful tool call the
    untrained tiny model never makes with these tools."""
    from harnessrl.trainer.sft import SftConfig, sft

    where = tmp_path_factory.mktemp("toolbox-warm")
    task, delegated = toolbox.generate(0)[0][0], toolbox.generate(0, delegate=True)[0][0]
    lines = toolbox.write([task, delegated], where / "sft.jsonl", sft=True)
    model = sft(SftConfig(tasks=str(lines), model=str(tiny_model_dir), out=str(where / "model"), steps=80,
                          batch_size=4, lr=1e-2, seed=0))
    return model, task, delegated


def test_toolbox_episode_ends_on_the_first_successful_call_and_is_scored(tmp_path, toolbox_model):
    from harnessrl.harness_examples.toolbox.harness import ToolboxConfig, run_rollout
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    model, task, delegated = toolbox_model
    table = toolbox.world(0)
    # another task of the same world: the fitted model makes its one (successful) call anyway,
    # with the wrong tool or item for this task
    other = next(t for t in toolbox.generate(0)[0] if t.value != task.value)
    db = str(tmp_path / "runs.db")
    greedy = ToolboxConfig(temperature=0.0)
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(model), port=0)) as proxy:
        right = run_rollout(proxy.url, table, task, greedy, run="right")
        wrong = run_rollout(proxy.url, table, other, greedy, run="wrong")
        planner = run_rollout(proxy.url, table, delegated, greedy, run="delegated")
    # the right call ends the episode after one model call; its result is the answer
    assert (right.answer, right.outcome) == (task.value, 1.0)
    assert {k: right.metrics[k] for k in ("model_calls", "tool_calls", "tool_errors")} == \
        {"model_calls": 1, "tool_calls": 1, "tool_errors": 0}
    # a call that runs but answers another question ends the episode too, and scores 0
    assert wrong.metrics["model_calls"] == 1 and wrong.metrics["tool_errors"] == 0
    assert wrong.answer in set(table.values()) and wrong.answer != other.value and wrong.outcome == 0.0
    # delegated: the worker's call ends the worker, its result is the planner's tool result, and
    # that ends the planner with it as the answer
    assert (planner.answer, planner.outcome) == (delegated.value, 1.0)
    assert planner.metrics["worker_calls"] == 1 and planner.metrics["model_calls"] == 1
    _, Session = open_db(db)
    with Session() as s:
        for run, result, agents in (("right", right, ["agent"]), ("wrong", wrong, ["agent"]),
                                    ("delegated", planner, ["planner", "worker"])):
            rollout = s.scalars(select(Rollout).where(Rollout.run == run)).one()
            calls = s.scalars(select(Call).where(Call.rollout_id == rollout.id).order_by(Call.seq)).all()
            assert [c.agent for c in calls] == agents  # one model call per agent: nothing after the tool
            assert s.scalars(select(Reward.value).where(Reward.rollout_id == rollout.id)).one() == result.outcome


def test_a_wrong_item_that_shares_the_answer_value_is_not_a_success(tmp_path, toolbox_model):
    """Values repeat (6 per attribute over 32 items), so the right tool called with another item
    often returns the asked value: that is still the wrong call, and scores 0. Here the question
    is about another item in a world where both items share the value; the fitted model calls
    the right tool with the item it was fitted on (solo: itself; delegated: its worker)."""
    from harnessrl.harness_examples.toolbox.harness import ToolboxConfig, run_rollout
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    model, task, delegated = toolbox_model
    other = next(i for i in toolbox.ITEMS if i not in (task.item, delegated.item))
    db = str(tmp_path / "runs.db")
    results = {}
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(model), port=0)) as proxy:
        for fitted in (task, delegated):
            table = {**toolbox.world(0), (other, fitted.attribute): fitted.value}
            lucky = toolbox.ToolboxTask(f"toolbox-{other}-{fitted.attribute}", other, fitted.attribute,
                                        fitted.value, fitted.delegate)
            results[fitted] = run_rollout(proxy.url, table, lucky, ToolboxConfig(temperature=0.0),
                                          run=f"lucky-{fitted.delegate}")
    _, Session = open_db(db)
    with Session() as s:
        for fitted, result in results.items():
            rollout = s.scalars(select(Rollout).where(Rollout.run == f"lucky-{fitted.delegate}")).one()
            calls = s.scalars(select(Call).where(Call.rollout_id == rollout.id).order_by(Call.seq)).all()
            made = calls[-1].tool_calls[0]["function"]  # solo: the agent's call; delegated: the worker's
            assert (made["name"], json.loads(made["arguments"])) == (f"get_{fitted.attribute}", {"item": fitted.item})
            # the answer is the asked value, but from the wrong item: no success, no reward
            assert result.answer == fitted.value and result.metrics["em"] == 1.0
            assert result.outcome == 0.0 and result.metrics["success"] == 0.0
            assert s.scalars(select(Reward.value).where(Reward.rollout_id == rollout.id)).one() == 0.0
            # the two skills apart: the action (tool) was right, the args (item) were not
            assert (result.metrics["right_tool"], result.metrics["right_item"]) == (1.0, 0.0)
