"""The app layer's registries: algorithms (compile defaults shared by compile, train and loop) and
harnesses (the examples and a user's own `module:function`), run against a real proxy."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI
from sqlalchemy import select

from harnessrl.algorithms import ALGORITHMS, default_train_agents, get_algorithm
from harnessrl.app.rollouts.harnesses import HARNESSES, TaskSource, load_harness
from harnessrl.client import HarnessRL
from harnessrl.db import open_db
from harnessrl.errors import UserError
from harnessrl.records import Call, Reward, Rollout


def test_algorithm_defaults():
    assert set(ALGORITHMS) == {"grpo", "capo", "matpo", "pact"}
    assert get_algorithm("matpo").train_agents == "all"  # planner and workers, unless told otherwise
    assert get_algorithm("capo").advantage == "harness"
    assert default_train_agents("matpo") == "all"
    assert default_train_agents("grpo") == "central"
    with pytest.raises(UserError, match="unknown --algo 'ppo'"):
        get_algorithm("ppo")


def test_every_algorithm_has_a_trainer():
    from harnessrl.trainer.run import TRAINERS

    assert set(TRAINERS) == set(ALGORITHMS)


def test_unknown_harness_names_the_choices(tmp_path):
    src = TaskSource(None, None, tmp_path, 4, 0.25, 0)
    with pytest.raises(UserError, match="lookup | react"):
        load_harness("nope", src)
    with pytest.raises(UserError, match="cannot load it"):
        load_harness("no_such_module:run", src)
    with pytest.raises(UserError, match="--tasks FILE"):
        load_harness("test_app_registry:echo_harness", src)


def test_example_harness_loads_its_tasks(tmp_path):
    h = load_harness("lookup", TaskSource(None, None, tmp_path, 8, 0.25, 0))
    assert (len(h.train), len(h.eval)) == (6, 2)  # 8 tasks, a quarter held out
    assert h.tasks_file.is_file() and len(h.tasks_file.read_text().splitlines()) == 8
    assert set(HARNESSES) == {"lookup", "toolbox", "toolbox_delegate", "multihop", "noisy_delegate", "noisy_single",
                              "toolbox_sparse", "toolbox_slow", "react", "planner_worker", "langgraph", "bfcl", "assistant",
                              "bfcl_single"}


def echo_harness(proxy_url, task, *, group_id, run, temperature):
    """A user's own harness: one model call through the proxy, outcome reported by the harness."""
    with HarnessRL(proxy_url).rollout(task_id=task.id, group_id=group_id, run=run) as ro:
        client = OpenAI(base_url=ro.base_url("solver"), api_key="unused")
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.input}],
                                               max_tokens=4, temperature=temperature)
        outcome = 1.0 if task.reference in (reply.choices[0].message.content or "") else 0.25
        ro.reward(outcome)
    return outcome


def test_user_harness_runs_through_the_proxy(tmp_path, tiny_model_dir):
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "input": f"say {i}", "reference": "zzz-never"}) + "\n"
                             for i in range(4)))
    h = load_harness("test_app_registry:echo_harness", TaskSource(tasks, None, tmp_path, 4, 0.25, 0))
    assert [t.id for t in h.train] == ["t0", "t1", "t2"] and [t.id for t in h.eval] == ["t3"]
    db = str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0)) as proxy:
        result = h.run(proxy.url, h.train[1], "g/t1", "round-0", 0.0)
    assert (result.task_id, result.outcome) == ("t1", 0.25)
    _, Session = open_db(db)
    with Session() as s:
        rollout = s.scalars(select(Rollout).where(Rollout.run == "round-0")).one()
        assert (rollout.task_id, rollout.group_id, rollout.status) == ("t1", "g/t1", "finished")
        call = s.scalars(select(Call).where(Call.rollout_id == rollout.id)).one()
        assert call.agent == "solver" and call.status == "ok"
        assert s.scalars(select(Reward.value).where(Reward.rollout_id == rollout.id)).one() == 0.25


def bad_harness(proxy_url, task, *, group_id, run, temperature):
    return "done"


def test_user_harness_must_return_an_outcome(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "input": "x"}\n{"id": "b", "input": "y"}\n')
    h = load_harness("test_app_registry:bad_harness", TaskSource(tasks, None, tmp_path, 4, 0.5, 0))
    with pytest.raises(UserError, match="returned str"):
        h.run("http://127.0.0.1:1", h.train[0], "g", "r", 1.0)
