"""react through the real proxy on the tiny model: a group of two rollouts of one task, one
agent session each, every model call recorded, the F1 outcome reported."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.harness_examples.react import ReactConfig, run_rollout
from harnessrl.harness_examples.search_task import load_search_tasks, score
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, Reward, Rollout


def test_group_of_rollouts(tiny_model_dir, tmp_path):
    db = str(tmp_path / "runs.db")
    tasks = load_search_tasks(seed=1, n_tasks=1)
    task = tasks.tasks[0]
    cfg = ReactConfig(max_turns=3, max_tokens=24)
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0)) as p:
        results = [run_rollout(p.url, tasks.env, task, cfg, group_id="g-react", run="round-0") for _ in range(2)]
    _, make_session = open_db(db)
    with make_session() as s:
        for r in results:
            calls = s.scalars(select(Call).where(Call.rollout_id == r.rollout_id).order_by(Call.seq)).all()
            assert len(calls) == r.metrics["model_calls"] >= 1
            assert {c.agent for c in calls} == {"agent"}
            assert all(c.completion_ids is not None for c in calls)  # server token ids were recorded
            tools = [t["function"]["name"] for t in calls[0].request["tools"]]
            assert tools == ["search", "calculator"]
            # every tool call the model made got a tool message in the next prompt
            for prev, nxt in zip(calls, calls[1:]):
                n_calls = len(prev.response["choices"][0]["message"].get("tool_calls") or [])
                assert sum(m["role"] == "tool" for m in nxt.request["messages"][len(prev.request["messages"]) + 1:]) == n_calls
            rollout = s.get(Rollout, r.rollout_id)
            assert (rollout.group_id, rollout.run, rollout.status) == ("g-react", "round-0", "finished")
            rewards = s.scalars(select(Reward).where(Reward.rollout_id == r.rollout_id)).all()
            assert [(x.kind, x.value) for x in rewards] == [("outcome", pytest.approx(score(r.answer, task)["f1"]))]
    assert results[0].rollout_id != results[1].rollout_id


def test_a_refused_call_ends_the_episode_not_the_harness(tiny_model_dir, tmp_path):
    """A call the backend refuses (here: more tokens than the model's context) stops the rollout
    with the server's message; the outcome 0 is still reported and the rollout finished."""
    db = str(tmp_path / "runs.db")
    tasks = load_search_tasks(seed=1, n_tasks=1)
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0)) as p:
        result = run_rollout(p.url, tasks.env, tasks.tasks[0], ReactConfig(max_tokens=10_000_000))
    assert "maximum context length" in result.error and result.outcome == 0.0 and result.metrics["model_calls"] == 1
    _, make_session = open_db(db)
    with make_session() as s:
        assert s.get(Rollout, result.rollout_id).status == "finished"
        assert [r.value for r in s.scalars(select(Reward).where(Reward.rollout_id == result.rollout_id))] == [0.0]
