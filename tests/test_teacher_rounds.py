"""A teacher with one command: `harnessrl run --upstream` records a program against a hosted
model (the Anthropic stand-in), and `harnessrl loop --teacher` runs a warm-up round of the
harness against it, keeps its best rollouts as expert traces and warms the policy up on them
with SFT before the RL rounds on the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.records import TEXT_ONLY, Call, ExpertTrace, Rollout

KEY = "sk-ant-teacher-51c2"
CLI = [sys.executable, "-m", "harnessrl"]


@pytest.fixture(scope="module")
def teacher():
    from anthropic_standin import create_app
    from asgi_thread import serve_in_thread

    app, requests = create_app(KEY)
    with serve_in_thread(app) as url:
        yield url, requests


def _everything(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file() and p.suffix != ".safetensors")


def test_run_records_a_program_against_the_teacher(teacher, tmp_path):
    url, requests = teacher
    requests.clear()
    script = tmp_path / "agent.py"
    script.write_text("import openai\n"
                      "c = openai.OpenAI()\n"  # base URL and key from the variables `harnessrl run` sets
                      "r = c.chat.completions.create(model='whatever', max_tokens=20,\n"
                      "    messages=[{'role': 'user', 'content': 'hello teacher'}])\n"
                      "print(r.choices[0].message.content)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    db = tmp_path / "runs.db"
    done = subprocess.run(CLI + ["run", "--upstream", url, "--upstream-api-key", KEY, "--upstream-dialect", "anthropic",
                                 "--upstream-model", "claude-standin", "--no-intercept", "--db", str(db), "--task", "t1",
                                 "--reward-from", "exit-code", "--", sys.executable, str(script)],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "You said: hello teacher" in done.stdout
    assert requests[0]["body"]["model"] == "claude-standin"  # the teacher's model, whatever the program asked
    _, Session = open_db(str(db))
    with Session() as s:
        (ro,) = s.scalars(select(Rollout)).all()
        (call,) = s.scalars(select(Call)).all()
    assert ro.run == "teacher" and ro.task_id == "t1" and ro.status == "finished"
    assert call.prompt_path == TEXT_ONLY and call.status == "ok"
    assert KEY.encode() not in _everything(tmp_path) and KEY not in done.stdout + done.stderr
    both = subprocess.run(CLI + ["run", "--upstream", url, "--model", str(tmp_path), "--", "true"],
                          capture_output=True, text=True)
    assert both.returncode == 2 and "--upstream" in both.stderr


def test_loop_warms_up_on_the_teacher_then_trains_the_policy(teacher, tiny_model_dir, tmp_path):
    url, requests = teacher
    requests.clear()
    out = tmp_path / "loop"
    cmd = CLI + ["loop", "--harness", "lookup", "--model", str(tiny_model_dir), "--out", str(out), "--rounds", "1",
                 "--group-size", "2", "--n-tasks", "3", "--eval-fraction", "0.34", "--steps", "1", "--batch-size", "4",
                 "--concurrency", "4", "--teacher", url, "--teacher-api-key", KEY, "--teacher-dialect", "anthropic",
                 "--teacher-model", "claude-standin", "--teacher-min-reward", "1", "--teacher-sft-steps", "3"]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((out / "loop_state.json").read_text())
    assert state["teacher"]["run"] == "teacher-a1" and state["teacher"]["success"] == 1.0
    assert state["teacher"]["traces"] == 2  # the two training tasks, each solved by the teacher
    assert state["teacher"]["checkpoint"] == str(out / "teacher-warm")
    assert [r["round"] for r in state["rounds"]] == [0]
    traces = [json.loads(line) for line in (out / "teacher_traces.jsonl").read_text().splitlines()]
    assert all(t["expert_trace"][-1]["content"].startswith("The answer is <answer>") for t in traces)
    _, Session = open_db(str(out / "runs.db"))
    with Session() as s:
        runs = {r.id: r.run for r in s.scalars(select(Rollout))}
        calls = s.scalars(select(Call)).all()
        stored = s.scalars(select(ExpertTrace).where(ExpertTrace.source.like("rollout:%"))).all()
    assert {runs[c.rollout_id] for c in calls if c.prompt_path == TEXT_ONLY} == {"teacher-a1"}
    assert all(c.prompt_ids for c in calls if runs[c.rollout_id].startswith("round-0"))  # the policy's: token ids
    assert len(stored) == 2 and all(runs[t.source.split(":", 1)[1]] == "teacher-a1" for t in stored)
    assert all(r["body"]["model"] == "claude-standin" for r in requests)
    assert KEY.encode() not in _everything(out)
