"""The coding family under `harnessrl loop --async`, as tests/test_coding_loop.py runs the round
loop: `harnessrl tasks coding`, then `loop --async --cmd` with the built-in coding agent on the
tiny model, each rollout in a fresh workspace inside the bubblewrap sandbox, its reward from the
hidden tests. Before the agent, each rollout's command plants a conftest.py that would pass every
test: the reward is still the hidden tests' signed pass fraction of the broken code. The groups,
steps and versions are checked against the DB as on the local backend (test_loop_async.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.records import Reward, Rollout
from test_loop_async import _check_accounting
from test_reward_integrity import FORCE_PASS

HRL = [sys.executable, "-m", "harnessrl"]
PLANT = f"open('conftest.py', 'w').write({FORCE_PASS!r}); print('planted conftest.py')"
# the probe prints the network interfaces the rollout sees (in the sandbox only lo), then the plant, then the agent
PY = shlex.quote(sys.executable)
AGENT = (f"cat /proc/net/dev; {PY} -c {shlex.quote(PLANT)}; "
         f"{PY} -m harnessrl.harness_examples.coding.agent {{task}} --max-turns 3 --max-tokens 48")


def test_async_coding_loop_in_the_sandbox(tiny_model_dir, tmp_path):
    if subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "true"], capture_output=True).returncode:
        pytest.skip("bubblewrap cannot make a sandbox here")
    made = subprocess.run(HRL + ["tasks", "coding", "--out", str(tmp_path / "tasks"), "--n-train", "2", "--n-eval", "1",
                                 "--seed", "0"], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    out = tmp_path / "loop"
    tasks = tmp_path / "tasks" / "coding.jsonl"
    run = subprocess.run(HRL + ["loop", "--async", "--cmd", AGENT, "--tasks", str(tasks), "--n-tasks", "3",
                                "--eval-fraction", "0.34", "--model", str(tiny_model_dir), "--out", str(out),
                                "--rounds", "1", "--steps", "2", "--group-size", "2", "--groups-per-step", "1",
                                "--concurrency", "2", "--sandbox", "bwrap", "--timeout", "300"],
                         capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    _, Session = open_db(str(out / "runs.db"))
    with Session() as s:
        rollouts = {r.id: r for r in s.scalars(select(Rollout))}
        rewards = {w.rollout_id: w for w in s.scalars(select(Reward).where(Reward.kind == "outcome"))}
    assert [(r.run, r.id) for r in rollouts.values() if r.status == "running"] == []  # none left behind
    state = _check_accounting(out)
    assert state["totals"]["steps"] == 2 == len(state["steps"]) and all(r["pushed"] for r in state["steps"])
    assert state["initial_eval"] is not None and [e["step"] for e in state["evals"]] == [1]

    trained = [r for row in state["steps"] for g in row["groups"] for r in state["groups"][g]["rollouts"]]
    assert len(trained) == 4  # two steps of one group of two
    for rid in trained + [r.id for r in rollouts.values() if r.run.startswith("eval-")]:
        meta = rewards[rid].meta or {}
        # the tiny model fixes nothing and the planted conftest.py passes nothing: the hidden cases'
        # pass fraction of the broken code, from the data tests' answers (the family's default)
        assert (meta.get("tests"), meta.get("report")) == ("calls", "read"), meta
        assert meta.get("failed", 0) + meta.get("errors", 0) > 0, meta
        assert 0.0 <= rewards[rid].value < 1.0 and re.search(r"\d+ (passed|failed)", meta.get("output", "")), meta
    logs = [p.read_text() for p in out.rglob("*.log")]
    ran = [log for log in logs if "Inter-|" in log]  # /proc/net/dev's header: the rollout's command ran
    assert len(ran) >= len(trained) + 2
    for log in ran:
        assert re.findall(r"^\s*(\w+):\s+\d", log, re.M) == ["lo"] and "planted conftest.py" in log, log[:500]
