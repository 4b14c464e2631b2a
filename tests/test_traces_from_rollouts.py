"""`harnessrl traces from-rollouts`: a teacher's recorded rollouts (here the tiny model through
the real proxy, the lookup harness, greedy) become expert traces in the tasks format — the best
rollout per task, the harness's system prompt and tool schemas kept, provenance recorded — that
`tasks import`, `compile --algo pact` and `train --algo pact` consume for a step."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from harnessrl.client import HarnessRL
from harnessrl.compiler.tasks import import_tasks
from harnessrl.compiler.expert_traces import collect, split_conversation, write_db, write_jsonl
from harnessrl.db import open_db
from harnessrl.errors import UserError
from harnessrl.harness_examples.chat import make_client, tool_loop
from harnessrl.harness_examples.lookup.tasks import LOOKUP_TOOL, generate
from harnessrl.proxy.local.backend import LocalBackend
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import ExpertTrace, Task
from harnessrl.tasks_file import read_tasks

CLI = [sys.executable, "-m", "harnessrl"]


@pytest.fixture(scope="module")
def teacher_db(tiny_model_dir, tmp_path_factory):
    """Two tasks × two greedy rollouts of the lookup harness's tool loop, run "teacher", with
    chosen outcomes: per task one rollout rewarded 0.25 and one 1.0 (reported twice: the latest
    report wins); plus a rollout without an outcome."""
    db = str(tmp_path_factory.mktemp("teacher") / "runs.db")
    tasks = generate(2, seed=3)
    table = {t.key: t.value for t in tasks}
    ids: dict[str, list[str]] = {}
    listed = tmp_path_factory.mktemp("tasks") / "tasks.jsonl"  # references, no hand-written traces
    listed.write_text("".join(json.dumps({"id": t.id, "input": t.question, "reference": t.value}) + "\n"
                              for t in tasks))
    import_tasks(db, listed)
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0),
                   backend=LocalBackend(tiny_model_dir, seed=0)) as proxy:
        hrl = HarnessRL(proxy.url)
        for t in tasks:
            for outcomes in ([0.25], [0.0, 1.0]):
                with hrl.rollout(task_id=t.id, run="teacher") as ro:
                    with make_client(ro.base_url("agent"), f"hrl-{ro.id}-agent") as client:
                        tool_loop(client, "tiny", t.messages(), [LOOKUP_TOOL], {"lookup": table.get},
                                  max_turns=2, max_tokens=40, temperature=0.0)
                    for value in outcomes:
                        ro.reward(value)
                    ids.setdefault(t.id, []).append(ro.id)
        with hrl.rollout(task_id=tasks[0].id, run="teacher") as ro:  # no outcome: never a trace
            ids["no-outcome"] = [ro.id]
    return db, tasks, ids


@pytest.mark.unit
def test_split_conversation_puts_the_prompt_in_input():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q", "junk": 1},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                  "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "R"}, {"role": "assistant", "content": "A"}]
    inp, expert = split_conversation(msgs)
    assert inp == [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert [m["role"] for m in expert] == ["assistant", "tool", "assistant"]
    assert split_conversation([{"role": "user", "content": "Q"}]) is None  # no answer: no trace
    assert split_conversation([{"role": "assistant", "content": "A"}]) is None  # no prompt: no trace


def test_best_rollout_per_task_with_tools_and_provenance(teacher_db, tmp_path):
    db, tasks, ids = teacher_db
    out = tmp_path / "tasks.jsonl"
    res = subprocess.run(CLI + ["traces", "from-rollouts", "--db", db, "--run", "teacher", "--out", str(out)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "2 traces from 5 rollouts" in res.stdout and "1 without an outcome" in res.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(t.id for t in tasks)
    for row in rows:
        assert row["provenance"]["rollout_id"] == ids[row["id"]][1]  # the 1.0 rollout, not the 0.25 one
        assert row["provenance"]["reward"] == 1.0 and row["provenance"]["agent"] == "agent"
        assert row["input"][-1]["role"] == "user" and row["expert_trace"][0]["role"] == "assistant"
        assert [t["function"]["name"] for t in row["tools"]] == ["lookup"]
        assert row["reference"] == next(t.value for t in tasks if t.id == row["id"])
    # the greedy tiny model calls the tool first: the trace holds the call and its observation
    first = rows[0]["expert_trace"]
    assert first[0].get("tool_calls") and first[1]["role"] == "tool"
    assert len(read_tasks(out)) == 2  # the tasks format's own parser takes it

    # --min-reward above every outcome: nothing; a one-line error for a bad flag pair
    traces, stats = collect(db, run="teacher", min_reward=1.5)
    assert traces == [] and stats.below_min == 4
    bad = subprocess.run(CLI + ["traces", "from-rollouts", "--db", db], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--out" in bad.stderr


def test_identical_traces_are_written_once(teacher_db, tmp_path):
    db, tasks, _ = teacher_db
    # greedy decoding: both rollouts of a task hold the same conversation, so a second distinct one is not there
    traces, stats = collect(db, run="teacher", per_task=2)
    assert len(traces) == 2 and stats.duplicates == 2
    with pytest.raises(UserError, match="one trace per task"):
        write_jsonl(traces + traces, tmp_path / "never-written.jsonl")
    assert not (tmp_path / "never-written.jsonl").exists()


def test_traces_into_the_db_feed_a_pact_step(teacher_db, tiny_model_dir, tmp_path):
    db, tasks, _ = teacher_db
    traces, _ = collect(db, run="teacher")
    assert write_db(db, traces) == 2
    assert write_db(db, traces) == 0  # the same rollouts again: not added twice
    _, Session = open_db(db)
    with Session() as s:
        stored = s.scalars(select(ExpertTrace)).all()
        assert sorted(t.task_id for t in stored) == sorted(t.id for t in tasks)
        assert all(t.source.startswith("rollout:") for t in stored)
        assert {t.id for t in s.scalars(select(Task))} >= {t.id for t in tasks}

    out = tmp_path / "compiled"
    comp = subprocess.run(CLI + ["compile", "--db", db, "--algo", "pact", "--run", "teacher", "--out", str(out),
                                 "--tokenizer", str(tiny_model_dir)], capture_output=True, text=True)
    assert comp.returncode == 0, comp.stderr
    task_rows = pq.read_table(out / "tasks.parquet").to_pydict()
    with_trace = [json.loads(t) for t in task_rows["expert_trace"] if t]
    assert len(with_trace) == 2 and all(tr["turns"] for tr in with_trace)  # structured, with tool-call turns
    train = subprocess.run(CLI + ["train", str(out), "--algo", "pact", "--model", str(tiny_model_dir),
                                  "--out", str(tmp_path / "ckpt"), "--steps", "1"], capture_output=True, text=True)
    assert train.returncode == 0, train.stderr[-2000:]
