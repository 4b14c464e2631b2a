"""langgraph_search: a LangGraph agent (ChatOpenAI + ToolNode) whose only change is the proxy
base URL; its calls are recorded under the rollout and its outcome reported."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.harness_examples.langgraph_search import LangGraphConfig, run_rollout
from harnessrl.harness_examples.search_task import load_search_tasks, score
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, Reward


def test_langgraph_rollout(tiny_model_dir, tmp_path):
    db = str(tmp_path / "runs.db")
    tasks = load_search_tasks(seed=2, n_tasks=1)
    task = tasks.tasks[0]
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0)) as p:
        result = run_rollout(p.url, tasks.env, task, LangGraphConfig(max_turns=3, max_tokens=24))
    _, make_session = open_db(db)
    with make_session() as s:
        calls = s.scalars(select(Call).where(Call.rollout_id == result.rollout_id).order_by(Call.seq)).all()
        rewards = s.scalars(select(Reward).where(Reward.rollout_id == result.rollout_id)).all()
    assert calls and all(c.agent == "agent" for c in calls)
    assert calls[0].request["messages"][1] == {"role": "user", "content": task.question}
    assert [t["function"]["name"] for t in calls[0].request["tools"]] == ["search"]
    if result.error is None:  # the graph ended by itself: one recorded call per AI message
        assert len(calls) == result.metrics["model_calls"]
    else:
        assert "agent steps" in result.error and len(calls) == 3
    assert [(r.kind, r.value) for r in rewards] == [("outcome", pytest.approx(score(result.answer, task)["f1"]))]
