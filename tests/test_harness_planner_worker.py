"""planner_worker through the real proxy on the tiny model: one rollout yields a planner session
and worker sessions whose calls name the planner call that dispatched them; the worker's first
message carries the user-query recap and its last call is the summary turn whose text reaches
the planner; the outcome reward is the F1 of the answer."""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from harnessrl.compiler.pipeline import CompileOptions, Compiler
from harnessrl.db import open_db
from harnessrl.harness_examples.planner_worker import PlannerWorkerConfig, run_rollout
from harnessrl.harness_examples.planner_worker.harness import SUMMARY_PROMPT
from harnessrl.harness_examples.search_task import load_search_tasks, score
from harnessrl.harness_examples.text_metrics import extract_answer
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, Reward, Rollout


@pytest.fixture(scope="module")
def proxy(tiny_model_dir, tmp_path_factory):
    db = str(tmp_path_factory.mktemp("planner_worker") / "runs.db")
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0)) as p:
        yield p, db


def _calls(db: str, rollout_id: str) -> list[Call]:
    _, make_session = open_db(db)
    with make_session() as s:
        return list(s.scalars(select(Call).where(Call.rollout_id == rollout_id).order_by(Call.seq)))


def test_rollout_has_planner_and_worker_sessions_with_parent_edges(proxy, tmp_path):
    p, db = proxy
    tasks = load_search_tasks(seed=0, n_tasks=1)
    task = tasks.tasks[0]
    cfg = PlannerWorkerConfig(max_planner_turns=2, max_worker_turns=1, max_tokens=24, always_dispatch_first=True)
    result = run_rollout(p.url, tasks.env, task, cfg, group_id="g-pw")

    calls = _calls(db, result.rollout_id)
    assert result.error is None
    assert len(calls) == result.metrics["model_calls"]
    sessions = {c.session_id for c in calls}
    workers = sorted(s for s in sessions if s.startswith("worker-"))
    assert "planner" in sessions and len(workers) == result.metrics["workers"] >= 1
    planner_ids = {c.id for c in calls if c.session_id == "planner"}
    assert {c.agent for c in calls} == {"planner", "worker"}
    for c in calls:
        if c.session_id != "planner":
            assert c.agent == "worker" and c.parent_call_id in planner_ids
            assert c.request["messages"][1]["content"].startswith(f"User query recap: {task.question}\n\nYour sub-task: ")
    for w in workers:
        summary = [c for c in calls if c.session_id == w][-1]
        assert summary.request["messages"][-1] == {"role": "user", "content": SUMMARY_PROMPT}
    # The first worker's summary (or its fallback) reaches the planner's next call.
    second_planner = [c for c in calls if c.session_id == "planner"][1]
    first_summary = [c for c in calls if c.session_id == workers[0]][-1]
    report = extract_answer(first_summary.response["choices"][0]["message"]["content"]) or "The search agent found nothing."
    assert any(report in str(m.get("content")) for m in second_planner.request["messages"][2:])

    _, make_session = open_db(db)
    with make_session() as s:
        rollout = s.get(Rollout, result.rollout_id)
        outcome = s.scalars(select(Reward).where(Reward.rollout_id == result.rollout_id, Reward.kind == "outcome")).all()
    assert rollout.status == "finished" and rollout.task_id == task.id and rollout.group_id == "g-pw"
    assert [r.value for r in outcome] == [pytest.approx(score(result.answer, task)["f1"])]

    # The records compile (MATPO, both roles trained): one prefix tree per session, no drift.
    stats = Compiler(db, CompileOptions(out=tmp_path, rollouts=(result.rollout_id,), advantage="matpo",
                                        train_agents="all", process=("tool_format", "dispatch_ok"))).run()["totals"]
    assert stats["calls"] == len(calls) and stats["failed"] == 0
    assert stats["sessions"] == len(sessions) and stats["roots_drift"] == 0 and stats["retokenized"] == 0
    rows = pq.read_table(tmp_path / "samples.parquet", columns=["agent", "session_id", "outcome_reward"]).to_pylist()
    assert {r["session_id"] for r in rows} == sessions and {r["agent"] for r in rows} == {"planner", "worker"}
    assert all(r["outcome_reward"] == pytest.approx(result.outcome) for r in rows)


def test_command_line(proxy, monkeypatch, capsys):
    p, _ = proxy
    cmd = [sys.executable, "-m", "harnessrl.harness_examples.planner_worker", "--proxy", p.url, "--n-tasks", "1",
           "--max-tokens", "16", "--max-planner-turns", "1", "--max-worker-turns", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "planner_worker" in done.stdout and "mean outcome" in done.stdout
    # An unreachable proxy: one line on stderr and exit code 2 (in-process: the same entry point).
    from harnessrl.harness_examples.planner_worker.__main__ import app
    from harnessrl.harness_examples.runner import main

    monkeypatch.setattr(sys, "argv", ["planner_worker", "--proxy", "http://127.0.0.1:9", "--n-tasks", "1"])
    with pytest.raises(SystemExit) as exit_:
        main(app)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: cannot reach the proxy") and err.count("\n") == 1
