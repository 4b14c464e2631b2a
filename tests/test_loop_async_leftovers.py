"""`loop --async --sandbox none`: the commands of a group still in flight when training ends do not
outlive the loop (helper E's find: one task's command sleeps 300 s; the loop trained its 2 steps
on the other groups, failed the sleeping group and exited 0, and the group's commands and
launch.py above them ran on, orphaned, until their --timeout). The flight's cancel stops them, and
their rollouts end failed ("stopped"), never with a reward."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

AGENT = """import json, os, sys, time
from openai import OpenAI
task = json.load(open(sys.argv[1]))
if task["input"] == "hang":
    time.sleep(300)
c = OpenAI(base_url=os.environ["HARNESSRL_BASE_URL"], api_key=os.environ["HARNESSRL_KEY"])
r = c.chat.completions.create(model="m", max_tokens=8, messages=[{"role": "user", "content": task["input"]}])
print(len(r.choices[0].message.content or "") % 2)
"""


def _marked(marker: bytes) -> list[str]:
    left = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes():
                left.append(proc.name + ": " + (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:160])
        except OSError:
            continue
    return left


def test_no_rollout_command_outlives_an_async_loop(tiny_model_dir, tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "input": x}) + "\n"
                             for i, x in enumerate(["Say hi", "hang", "Count", "Name a colour"])))
    marker = f"HRL_LEFTOVER={tmp_path}"
    run = subprocess.run([sys.executable, "-m", "harnessrl", "loop", "--async", "--cmd",
                          f"{sys.executable} {tmp_path / 'agent.py'} {{task}}", "--tasks", str(tasks),
                          "--eval-fraction", "0.25", "--reward-from", "stdout-json", "--sandbox", "none",
                          "--model", str(tiny_model_dir), "--out", str(tmp_path / "out"), "--rounds", "1",
                          "--steps", "2", "--group-size", "2", "--groups-per-step", "1", "--concurrency", "4"],
                         env={**os.environ, "HRL_LEFTOVER": str(tmp_path)}, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    state = json.loads((tmp_path / "out" / "loop_state.json").read_text())
    assert any(g["task_id"] == "t1" and g["status"] == "failed" for g in state["groups"].values())  # in flight at the end
    deadline = time.monotonic() + 10
    while (left := _marked(marker.encode())) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in (line.split(":")[0] for line in left):  # (the test's own clean-up)
        try:
            os.kill(int(pid), 9)
        except OSError:
            pass
    assert left == []
    from sqlalchemy import select

    from harnessrl.db import open_db
    from harnessrl.records import Rollout

    _, Session = open_db(str(tmp_path / "out" / "runs.db"))
    with Session() as s:
        hung = [r for r in s.scalars(select(Rollout)) if r.task_id == "t1" and r.run.startswith("async-")]
    assert hung and all(r.status == "failed" for r in hung)
