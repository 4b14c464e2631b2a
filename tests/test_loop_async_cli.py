"""`harnessrl loop --async` with a real CLI: Claude Code (the quickest of tests/harness_cli.py's
harnesses here, about 2 s a rollout) as the loop's `--cmd`, unmodified but limited to its Bash tool
(CMD says why), in the bubblewrap sandbox (loopback only, a private HOME), against the loop's proxy
over the scripted vLLM stand-in given as `--upstream` (tests/vllm_standin.py): it answers Claude
Code like an agent (a call of its Bash tool, then an answer quoting the output) and takes the loop's
weight pushes through vLLM's reload API. Two optimizer steps on groups of two; checked against the
records DB and the stand-in: the accounting of test_loop_async.py, every trained rollout's calls
recorded ok with token ids and in its step's samples, both pushes reloaded into the upstream, every
call that started after a push served by that version or a newer one, nothing left running. Every
rollout exits 0 (reward 1), so a group's advantages are 0: what this checks is the loop around a
real CLI, not learning."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import harness_cli as hc
import pyarrow.parquet as pq
import pytest
from scripted_agent import TOOL_OUTPUT
from sqlalchemy import select
from vllm_standin import WEIGHT_VERSION, create_app, run_standin

from harnessrl.db import open_db
from harnessrl.records import Call, Reward, Rollout, WeightVersion
from test_loop_async import _check_accounting

pytestmark = pytest.mark.harness
NAME = "claude-code"
# -p: print mode (non-interactive); Bash allowed, as a user answers its permission prompt; --tools Bash:
# its one built-in tool the scripted model calls. With all 25 (its default), their schemas make every
# prompt about 46k tokens of the tiny tokenizer, over which one CPU training step of two rollouts
# takes about 5 minutes; with Bash alone (its default system prompt kept) about 5k.
CMD = f"{shlex.quote(str(hc.program(NAME)))} -p {{input}} --allowedTools Bash --tools Bash"


def _tasks(path: Path) -> Path:
    """Three tasks of the compatibility suite's statement: two to train on, one held out."""
    path.write_text("".join(json.dumps({"id": f"t{i}", "input": hc.TASK}) + "\n" for i in range(3)))
    return path


def _leftovers(marker: str) -> list[str]:
    """This machine's processes whose environment holds `marker` (the loop's and its rollouts'),
    after a grace for those killed with the loop (bwrap's --die-with-parent) to go."""
    deadline = time.monotonic() + 10
    while True:
        left = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and marker.encode() in (proc / "environ").read_bytes():
                    argv = (proc / "cmdline").read_bytes().split(b"\0")
                    left.append(f"{proc.name}: {b' '.join(argv)[:200]!r}")
            except OSError:  # gone meanwhile, or not ours
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_async_loop_trains_on_claude_code_rollouts_through_the_scripted_upstream(tiny_model_dir, tmp_path):
    hc.require(NAME)
    if subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "true"], capture_output=True).returncode:
        pytest.skip("bubblewrap cannot make a sandbox here")
    out, home = tmp_path / "loop", tmp_path / "home"
    home.mkdir()
    marker = f"HRL_ASYNC_CLI={tmp_path}"
    # a user's environment: a fresh HOME, the fake keys (each rollout gets its own key instead)
    env = {**os.environ, "HOME": str(home), "TERM": "dumb", "NO_COLOR": "1", "COLUMNS": "200", **hc.KEYS,
           **hc.HARNESSES[NAME].env, "HRL_ASYNC_CLI": str(tmp_path)}
    app = create_app(str(tiny_model_dir), scripted=True, served=(hc.MODEL,))
    standin = app.state.standin
    with run_standin(str(tiny_model_dir), app) as upstream:
        run = subprocess.run([sys.executable, "-m", "harnessrl", "loop", "--async", "--cmd", CMD,
                              "--tasks", str(_tasks(tmp_path / "tasks.jsonl")), "--eval-fraction", "0.34",
                              "--reward-from", "exit-code", "--sandbox", "bwrap", "--timeout", "120",
                              "--model", str(tiny_model_dir), "--upstream", upstream, "--out", str(out),
                              "--rounds", "1", "--steps", "2", "--group-size", "2", "--groups-per-step", "1",
                              "--concurrency", "2"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        upstream_version, reloads = standin.version, standin.reloads
    assert _leftovers(marker) == []  # no CLI (nor anything it started) outlived the loop

    state = _check_accounting(out)
    _, Session = open_db(str(out / "runs.db"))
    with Session() as s:
        rollouts = {r.id: r for r in s.scalars(select(Rollout))}
        calls = list(s.scalars(select(Call).order_by(Call.created_at)))
        outcomes = {w.rollout_id: w.value for w in s.scalars(select(Reward).where(Reward.kind == "outcome"))}
        pushes = [(w.version, w.created_at) for w in s.scalars(select(WeightVersion).order_by(WeightVersion.id))]
    assert [(r.run, r.id) for r in rollouts.values() if r.status == "running"] == []  # none left behind

    # two optimizer steps, each on one group of two, each pushed into the upstream
    pushed = [v for v, _ in pushes]
    assert state["totals"]["steps"] == 2 and [len(r["groups"]) for r in state["steps"]] == [1, 1]
    assert len(set(pushed)) == 2 and WEIGHT_VERSION not in pushed
    assert state["versions"] == [None, *pushed] and [r["version"] for r in state["steps"]] == pushed
    assert all(r["pushed"] and r["samples"] > 0 for r in state["steps"])
    # every trained token carried the behaviour log-prob the upstream sampled it with
    assert [r["train_log"]["behaviour/unknown_frac"] for r in state["steps"]] == [0.0, 0.0]
    # the stand-in reloaded each checkpoint (vLLM's reload_weights), and serves the last
    assert reloads == 2 and upstream_version == pushed[-1]

    # every trained rollout: Claude Code ran to its end (exit 0 → reward 1), each of its calls ok with
    # token ids, and its Bash tool ran (the output came back in a later call)
    trained = [r for row in state["steps"] for g in row["groups"] for r in state["groups"][g]["rollouts"]]
    assert len(trained) == len(set(trained)) == 4
    for row in state["steps"]:  # each trained rollout is in its step's samples
        ids = set(pq.read_table(out / f"step-{row['step']}" / "samples" / "samples.parquet").column("rollout_id")
                  .to_pylist())
        assert ids == {r for g in row["groups"] for r in state["groups"][g]["rollouts"]}
    for rid in trained:
        mine = [c for c in calls if c.rollout_id == rid]
        summary = [(c.seq, c.surface, c.status, c.weight_version, (c.error or "")[:200]) for c in mine]
        assert rollouts[rid].status == "finished" and outcomes.get(rid) == 1.0, (rollouts[rid].meta, summary)
        assert len(mine) >= 2 and all(c.status == "ok" and c.prompt_ids and c.completion_ids for c in mine), summary
        assert {c.surface for c in mine} == {"messages"}, summary  # Anthropic's Messages API, as it speaks by default
        assert any(TOOL_OUTPUT in json.dumps(c.request["messages"]) for c in mine), summary

    # a call that started after a push completed was served by that version or a newer one, and a
    # session never went back to an older version (the stand-in's own before any push: index 0)
    order = {v: i for i, v in enumerate([WEIGHT_VERSION, *pushed])}
    assert {c.weight_version for c in calls} <= set(order)
    for c in calls:
        due = sum(1 for _, at in pushes if at < c.created_at)
        assert order[c.weight_version] >= due, (rollouts[c.rollout_id].run, c.weight_version, due)
    by_id = {c.id: c for c in calls}
    turns = [(by_id[c.prefix_call_id], c) for c in calls if c.prefix_call_id in by_id]  # a call, the one it extends
    assert {after.rollout_id for _, after in turns} >= set(trained)  # its answer extends its tool call
    assert all(order[before.weight_version] <= order[after.weight_version] for before, after in turns)
    # the held-out evaluation after the last step ran on the last pushed weights
    final = [c for c in calls if rollouts[c.rollout_id].run == "eval-s1-a1"]
    assert final and {c.weight_version for c in final} == {pushed[-1]} and all(c.status == "ok" for c in final)
    assert [e["step"] for e in state["evals"]] == [1] and state["evals"][0]["version"] == pushed[-1]
    print(f"\n{NAME}: {len(rollouts)} rollouts, {len(calls)} calls; loop totals {json.dumps(state['totals'])}")
