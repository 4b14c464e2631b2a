"""The coding family end to end on CPU, as CI runs it: `harnessrl tasks coding`, then `harnessrl
loop --cmd` with the built-in coding agent on the tiny model — each rollout in a fresh workspace
inside the bubblewrap sandbox, its reward from the hidden tests — then compile and a training
step. Small on purpose (2 training tasks × group 2, 1 held out, 1 round, 1 step): it runs on 2 cores."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.records import Call, Reward, Rollout

HRL = [sys.executable, "-m", "harnessrl"]
# the probe before the agent prints the network interfaces the rollout sees: in the sandbox only lo
AGENT = (f"cat /proc/net/dev; {shlex.quote(sys.executable)} -m harnessrl.harness_examples.coding.agent {{task}} "
         "--max-turns 3 --max-tokens 48")


@pytest.fixture(scope="module")
def looped(tiny_model_dir, tmp_path_factory):
    if subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "true"], capture_output=True).returncode:
        pytest.skip("bubblewrap cannot make a sandbox here")
    out = tmp_path_factory.mktemp("coding-loop")
    made = subprocess.run(HRL + ["tasks", "coding", "--out", str(out / "tasks"), "--n-train", "2", "--n-eval", "1",
                                 "--seed", "0"], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    run = subprocess.run(HRL + ["loop", "--cmd", AGENT, "--tasks", str(out / "tasks" / "coding.jsonl"),
                                "--n-tasks", "3", "--eval-fraction", "0.34", "--model", str(tiny_model_dir),
                                "--out", str(out / "loop"), "--rounds", "1", "--group-size", "2", "--steps", "1",
                                "--batch-size", "4", "--concurrency", "2", "--sandbox", "bwrap", "--timeout", "300"],
                         capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    _, Session = open_db(str(out / "loop" / "runs.db"))
    with Session() as s:
        rollouts = list(s.scalars(select(Rollout)))
        calls = list(s.scalars(select(Call)))
        rewards = list(s.scalars(select(Reward).where(Reward.kind == "outcome")))
        s.expunge_all()
    return {"out": out / "loop", "state": json.loads((out / "loop" / "loop_state.json").read_text()),
            "rollouts": rollouts, "calls": calls, "rewards": rewards, "stdout": run.stdout}


def _by_run(looped) -> dict[str, list]:
    runs: dict[str, list] = {}
    for r in looped["rollouts"]:
        runs.setdefault(r.run, []).append(r)
    return runs


def test_every_rollout_ran_the_agent_and_was_scored_by_the_hidden_tests(looped):
    runs = _by_run(looped)
    assert sorted(runs) == ["eval-0-a1", "eval-initial", "round-0-a1"], sorted(runs)
    assert [len(runs[k]) for k in ("eval-initial", "round-0-a1", "eval-0-a1")] == [1, 4, 1]
    assert len({r.group_id for r in runs["round-0-a1"]}) == 2  # two tasks, a group of two each
    calls = {}
    for c in looped["calls"]:
        calls.setdefault(c.rollout_id, []).append(c)
    rewards = {w.rollout_id: w for w in looped["rewards"]}
    for r in looped["rollouts"]:
        assert r.status == "finished" and not (r.meta or {}).get("error"), (r.id, r.status, r.meta)
        mine = calls.get(r.id, [])
        assert mine and all(c.status == "ok" and c.prompt_ids and c.completion_ids for c in mine), r.id
        assert [t["function"]["name"] for t in mine[0].request["tools"]] == ["bash", "read_file", "write_file", "edit"]
        reward = rewards[r.id]
        meta = reward.meta or {}
        # the tiny model fixes nothing: the reward is the hidden tests' pass fraction of the broken code
        assert 0.0 <= reward.value < 1.0 and meta.get("failed", 0) + meta.get("errors", 0) > 0, meta
        assert re.search(r"\d+ (passed|failed)", meta.get("output", "")), meta


def test_the_rollouts_ran_sandboxed(looped):
    """Each rollout's command printed the network interfaces it saw: the sandbox's loopback only."""
    logs = [p.read_text() for p in looped["out"].rglob("*.log")]
    seen = [log for log in logs if "Inter-|" in log]  # /proc/net/dev's header
    assert len(seen) >= 6, [str(p) for p in looped["out"].rglob("*.log")]
    for log in seen:
        names = re.findall(r"^\s*(\w+):\s+\d", log, re.M)
        assert names == ["lo"], log[:500]


def test_compile_and_one_training_step_left_samples_a_checkpoint_and_the_state(looped):
    state = looped["state"]
    assert [r["round"] for r in state["rounds"]] == [0]
    row = state["rounds"][0]
    assert state["initial_eval"] is not None and 0.0 <= row["eval_success"] <= 1.0
    assert (Path(row["checkpoint"]) / "config.json").is_file() and row["version"]
    assert state["model"] == row["checkpoint"]
    samples = pq.read_table(looped["out"] / "round-0-a1" / "samples" / "samples.parquet").to_pydict()
    trained = {r.id for r in looped["rollouts"] if r.run == "round-0-a1"}
    assert samples["rollout_id"] and set(samples["rollout_id"]) <= trained
    assert row["samples"] == len(samples["rollout_id"]) and row["tokens"] > 0
