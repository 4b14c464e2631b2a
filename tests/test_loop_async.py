"""`harnessrl loop --async` end to end on the tiny model: the accounting of groups, steps, versions
and staleness in loop_state.json checked against the records DB, the pinned evaluation, the
staleness bound, and a loop SIGKILLed at each failpoint (mid-rollouts, mid-compile, mid-step,
mid-push) resuming without losing a finished group or training one twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.records import Call, Rollout, WeightVersion

LOOP = [sys.executable, "-m", "harnessrl", "loop"]


def _cmd(model: Path, out: Path, *extra: str) -> list[str]:
    return LOOP + ["--harness", "lookup", "--model", str(model), "--out", str(out), "--async", "--group-size", "2",
                   "--n-tasks", "6", "--eval-fraction", "0.34", "--groups-per-step", "1", "--concurrency", "3",
                   "--rounds", "1", *extra]


def _run(cmd: list[str], failpoint: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("HARNESSRL_FAILPOINT", None)
    if failpoint:
        env["HARNESSRL_FAILPOINT"] = failpoint
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def _state(out: Path) -> dict:
    return json.loads((out / "loop_state.json").read_text())


def _db(out: Path):
    _, Session = open_db(str(out / "runs.db"))
    with Session() as s:
        rollouts = {r.id: r for r in s.scalars(select(Rollout))}
        calls = list(s.scalars(select(Call)))
        pushed = s.scalars(select(WeightVersion.version).order_by(WeightVersion.id)).all()  # push order
    return rollouts, calls, pushed


def _index(state: dict, version: str | None) -> int:
    return state["versions"].index(version) if version in state["versions"] else 0


def _check_accounting(out: Path) -> dict:
    """What must hold of any async loop_state.json, against the DB and the step directories."""
    state = _state(out)
    rollouts, calls, _ = _db(out)
    in_steps = [gid for row in state["steps"] for gid in row["groups"]]
    assert len(in_steps) == len(set(in_steps))  # no group trained twice
    trained = {gid for gid, g in state["groups"].items() if g["status"] == "trained"}
    assert set(in_steps) == trained
    seen: set[str] = set()
    for gid in trained:
        g = state["groups"][gid]
        ids = set(g["rollouts"])
        assert ids and not ids & seen  # no rollout in two groups
        seen |= ids
        assert {rollouts[r].run for r in ids} == {g["tag"]} and {rollouts[r].status for r in ids} == {"finished"}
        # the group's versions are among those that served its rollouts' calls (not all of them: a call
        # that generated nothing, a bare end of sequence, has no token to train)
        served = {c.weight_version for c in calls if c.rollout_id in ids and c.status == "ok"}
        assert g["versions"] and set(g["versions"]) <= served
    for row in state["steps"]:
        # staleness: the weights the step started from, less the oldest version of each group's tokens
        now = _index(state, row["from_version"])
        assert now == state["versions"].index(row["from_version"])
        assert row["staleness"] == [now - min(_index(state, v) for v in state["groups"][g]["versions"])
                                    for g in row["groups"]]
        assert all(state["groups"][g]["staleness"] == s for g, s in zip(row["groups"], row["staleness"]))
        assert row["group_versions"] == [state["groups"][g]["versions"] for g in row["groups"]]
        samples = pq.read_table(out / f"step-{row['step']}" / "samples" / "samples.parquet").to_pydict()
        assert set(samples["rollout_id"]) <= {r for g in row["groups"] for r in state["groups"][g]["rollouts"]}
        assert len(samples["rollout_id"]) == row["samples"]
    for g in state["groups"].values():  # a group that never finished left no running rollout
        if g["status"] == "failed" and g.get("why"):
            assert all(r.status == "failed" for r in rollouts.values() if r.run == g["tag"])
    return state


def test_async_loop_trains_steps_on_groups_and_records_their_versions(tiny_model_dir, tmp_path):
    out = tmp_path / "loop"
    # one rollout in flight and one group queued: a group starts only once the queued one is taken, so
    # the third step's group starts after the first push returned however fast the rollouts run (CI saw
    # every group of a deeper queue finish before the first push)
    done = _run(_cmd(tiny_model_dir, out, "--steps", "4", "--eval-every", "2", "--max-staleness", "3",
                     "--concurrency", "1", "--max-queued-steps", "1"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "harnessrl loop --async" in done.stdout
    state = _check_accounting(out)
    rollouts, calls, pushed = _db(out)
    t = state["totals"]
    assert state["mode"] == "async" and t["steps"] == 4 == sum(r["steps"] for r in state["steps"])
    assert t["versions"] == 4 and len(state["versions"]) == 5 and state["versions"][1:] == pushed
    assert [r["version"] for r in state["steps"]] == pushed and all(r["pushed"] for r in state["steps"])
    assert state["model"] == state["steps"][-1]["checkpoint"]
    assert t["max_staleness"] == max(s for r in state["steps"] for s in r["staleness"]) <= 3
    for key in ("producer_idle_s", "trainer_idle_s", "wall_s", "rollout_s", "train_s"):
        assert 0 <= t[key] <= t["wall_s"] or key == "rollout_s", key
    # training went on while rollouts ran: the training rollouts' calls were served by several versions
    train_ids = {r for g in state["groups"].values() for r in g.get("rollouts") or ()}
    assert len({c.weight_version for c in calls if c.rollout_id in train_ids}) >= 2
    trained = [g for g in state["groups"].values() if g["status"] == "trained"]
    assert "base" in trained[0]["versions"] and "base" not in trained[-1]["versions"], state["groups"]
    # the decoupled correction is on by default
    configs = [json.loads((out / f"step-{r['step']}" / "train_config.json").read_text()) for r in state["steps"]]
    assert configs[0]["tis"] is True and configs[0]["ratio_to"] == "round"
    # Adam goes on across pushes: each step starts from the last checkpoint's optimizer state, which
    # only the newest checkpoint keeps
    steps = state["steps"]
    assert [c["optimizer_state"] for c in configs] == [None] + [str(Path(r["checkpoint"]) / "optimizer.pt")
                                                                for r in steps[:-1]]
    assert [(Path(r["checkpoint"]) / "optimizer.pt").is_file() for r in steps] == [False] * 3 + [True]
    # evaluations after steps 1 and 3; step 1's on its own version, pinned while training went on
    assert [e["step"] for e in state["evals"]] == [1, 3] and state["evals"][0]["pinned"]
    for e in state["evals"]:
        ids = {r.id for r in rollouts.values() if r.run == f"eval-s{e['step']}-a1"}
        assert len(ids) == 2 and e["version"] == state["steps"][e["step"]]["version"]
        if e["pinned"]:
            assert {c.weight_version for c in calls if c.rollout_id in ids} == {e["version"]}


def test_staleness_zero_trains_only_tokens_of_the_weights_it_trains(tiny_model_dir, tmp_path):
    out = tmp_path / "loop"
    # two optimizer steps between pushes: a row per push, each of 2 steps over 2 groups
    done = _run(_cmd(tiny_model_dir, out, "--steps", "4", "--max-staleness", "0", "--push-every", "2"))
    assert done.returncode == 0, done.stderr[-3000:]
    state = _check_accounting(out)
    assert [(r["step"], r["steps"], len(r["groups"])) for r in state["steps"]] == [(0, 2, 2), (2, 2, 2)]
    assert state["totals"]["steps"] == 4 and len(state["versions"]) == 3
    assert json.loads((out / "step-2" / "train_config.json").read_text())["steps"] == 2
    for row in state["steps"]:
        assert row["staleness"] == [0] * len(row["groups"])
        for g in row["groups"]:
            assert {_index(state, v) for v in state["groups"][g]["versions"]} == {_index(state, row["from_version"])}
    dropped = [g for g in state["groups"].values() if g["status"] == "dropped"]
    assert state["totals"]["dropped_stale"] == len(dropped) and all(g["staleness"] > 0 for g in dropped)


def test_a_killed_async_loop_resumes_at_every_failpoint(tiny_model_dir, tmp_path):
    out = tmp_path / "loop"
    cmd = _cmd(tiny_model_dir, out, "--steps", "3")

    killed = _run(cmd, "rollouts")  # a group's first rollout in, the others in flight
    assert killed.returncode == -9, killed.stderr[-2000:]
    state = _state(out)
    running = [gid for gid, g in state["groups"].items() if g["status"] == "running"]
    assert running and not state["steps"]

    killed = _run(cmd, "compile")  # a group compiled, not yet queued
    assert killed.returncode == -9, killed.stderr[-2000:]
    state = _state(out)
    assert all(state["groups"][gid]["status"] == "failed" for gid in running)  # never counted
    rolled = [gid for gid, g in state["groups"].items() if g["status"] == "rolled"]
    assert rolled and not state["steps"]

    killed = _run(cmd, "step")  # step 0 trained and its checkpoint written, not yet recorded
    assert killed.returncode == -9, killed.stderr[-2000:]
    state = _state(out)
    assert not state["steps"] and all(state["groups"][gid]["status"] == "ready" for gid in rolled)
    orphan = list((out / "step-0" / "checkpoints").iterdir())
    assert len(orphan) == 1

    killed = _run(cmd, "push")  # step 0 recorded, its weights not pushed
    assert killed.returncode == -9, killed.stderr[-2000:]
    state = _state(out)
    assert [r["pushed"] for r in state["steps"]] == [False] and state["versions"] == [None]
    assert state["steps"][0]["checkpoint"] not in {str(p) for p in orphan}  # the step was trained again

    done = _run(cmd)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming after step 0" in done.stdout
    state = _check_accounting(out)
    assert state["totals"]["steps"] == 3 and state["attempts"] == 5
    assert all(r["pushed"] for r in state["steps"]) and len(state["versions"]) == 4
    trained = [g for row in state["steps"] for g in row["groups"]]
    assert set(rolled) <= set(trained)  # the group compiled when the loop died was trained, once
    _, _, pushed = _db(out)
    assert pushed == [r["version"] for r in state["steps"]]


def test_async_options_are_checked_before_anything_runs(tiny_model_dir, tmp_path):
    bad = _run(_cmd(tiny_model_dir, tmp_path / "a", "--steps", "2", "--push-every", "2", "--max-queued-steps", "1"))
    assert bad.returncode == 2 and "--max-queued-steps 1" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "a" / "loop_state.json").exists()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "loop_state.json").write_text(json.dumps({"model": str(tiny_model_dir), "mode": "sync"}))
    mixed = _run(_cmd(tiny_model_dir, tmp_path / "b", "--steps", "2"))
    assert mixed.returncode == 2 and "a sync loop's" in mixed.stderr and "Traceback" not in mixed.stderr


def test_async_loop_on_the_toolbox_family(tiny_model_dir, tmp_path):
    # the learning benchmark's family (harness_examples/toolbox), as bench/async_loop.py runs it
    out = tmp_path / "loop"
    cmd = LOOP + ["--harness", "toolbox", "--model", str(tiny_model_dir), "--out", str(out), "--async", "--n-tasks",
                  "8", "--group-size", "2", "--groups-per-step", "2", "--concurrency", "4", "--rounds", "1",
                  "--steps", "2"]
    done = _run(cmd)
    assert done.returncode == 0, done.stderr[-3000:]
    state = _check_accounting(out)
    assert state["totals"]["steps"] == 2 and [len(r["groups"]) for r in state["steps"]] == [2, 2]
    assert state["evals"] and state["evals"][-1]["version"] == state["steps"][-1]["version"]
