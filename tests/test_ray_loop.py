"""`harnessrl loop --executor ray` on a local Ray cluster of a head and two worker nodes
(ray.cluster_utils: real raylets, real workers), a worker node killed while it runs rollouts:
its rollouts are run again on the other node, each task × sample has exactly one counted
rollout, and the lost attempts are finished as failed and never compiled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from ray_cluster import local_cluster, raylet_pid
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.records import Reward, Rollout

pytestmark = pytest.mark.ray
AGENT = Path(__file__).with_name("concurrency_agent.py")


@pytest.fixture(scope="module")
def cluster():
    yield from local_cluster()


def test_loop_on_ray_survives_a_killed_worker_node(cluster, tiny_model_dir, tmp_path):
    c, workers = cluster
    out, markers = tmp_path / "loop", tmp_path / "markers"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "input": x}) + "\n"
                             for i, x in enumerate(["Say hi", "Count to two", "Name a colour"])))
    cmd = [sys.executable, "-m", "harnessrl", "loop", "--executor", "ray", "--ray-address", c.address,
           "--cmd", f"{sys.executable} {AGENT} {{task}} {markers} --barrier 4 --sleep 8", "--tasks", str(tasks),
           "--reward-from", "stdout-json", "--model", str(tiny_model_dir), "--out", str(out), "--rounds", "1",
           "--group-size", "2", "--eval-fraction", "0.34", "--steps", "1", "--batch-size", "4", "--concurrency", "4"]
    # the operator's key reaches the Ray workers' runners, never the rollouts' programs (issue 42)
    env = {**os.environ, "HARNESSRL_PROXY_API_KEY": "op-sekret"}
    loop = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    # four training rollouts at once on two nodes of two CPUs: both nodes run two each
    round_dir, deadline = markers / "round-0-a1", time.time() + 400
    while len(list(round_dir.glob("*.start"))) < 4 and time.time() < deadline and loop.poll() is None:
        time.sleep(0.1)
    started = {p.stem: json.loads(p.read_text())["raylet"] for p in round_dir.glob("*.start")}
    raylets = [str(raylet_pid(w)) for w in workers]
    on_victim = {rid for rid, raylet in started.items() if raylet == raylets[1]}
    c.remove_node(workers[1], allow_graceful=False)  # the raylet and its workers killed mid-rollout
    output, _ = loop.communicate(timeout=600)
    assert loop.returncode == 0, output[-3000:]
    keys = [json.loads(p.read_text())["keys"] for p in round_dir.glob("*.start")]
    assert keys and all(k["operator"] is None and k["openai"].split(":")[1].startswith("rk_") for k in keys)
    assert set(started.values()) == set(raylets)  # rollouts ran on both nodes
    assert on_victim  # killed mid-rollout: every rollout waits for all four to start, then sleeps 8 s

    state = json.loads((out / "loop_state.json").read_text())
    assert [r["round"] for r in state["rounds"]] == [0] and state["attempts"] == 1 and state["rounds"][0]["failed"] == 0
    _, Session = open_db(str(out / "runs.db"))
    with Session() as s:
        rollouts = {r.id: r for r in s.scalars(select(Rollout))}
        outcomes = Counter(s.scalars(select(Reward.rollout_id).where(Reward.kind == "outcome")))
    round_rollouts = [r for r in rollouts.values() if r.run == "round-0-a1"]
    counted = [r for r in round_rollouts if r.status != "failed"]
    failed = {r.id for r in round_rollouts if r.status == "failed"}
    # exactly one counted rollout per task × sample, each with exactly one outcome
    assert sorted(Counter(r.group_id for r in counted).items()) == [("round-0-a1/t0", 2), ("round-0-a1/t1", 2)]
    assert all(r.status == "finished" and outcomes[r.id] == 1 for r in counted)
    # the killed node's attempts, and only they, were redone: failed, unrewarded
    assert failed == on_victim and all(outcomes[rid] == 0 for rid in failed)
    assert all(rollouts[rid].meta["error"].startswith("abandoned") for rid in failed)
    samples = pq.read_table(out / "round-0-a1" / "samples" / "samples.parquet").column("rollout_id").to_pylist()
    assert samples and set(samples) <= {r.id for r in counted}
    for run in ("eval-initial", "eval-0-a1"):  # the held-out task, once each time, on Ray too
        assert [r.status for r in rollouts.values() if r.run == run] == ["finished"]


def test_a_hung_ray_rollout_is_cancelled_at_its_deadline_and_failed(cluster, tiny_model_dir, tmp_path):
    from harnessrl.app.rollouts.cmd_harness import cmd_harness
    from harnessrl.app.rollouts.executors import run_batch
    from harnessrl.app.rollouts.jobs import jobs_for, settle
    from harnessrl.app.rollouts.harnesses import TaskSource
    from harnessrl.app.rollouts.ray_rollouts import RayExecutor
    from harnessrl.client import HarnessRL
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    c, _ = cluster
    markers, tag = tmp_path / "markers", "round-0-a1"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t0", "input": "Say hi"}) + "\n" + json.dumps({"id": "t1", "input": "hang"}) + "\n")
    h = cmd_harness(f"{sys.executable} {AGENT} {{task}} {markers}", TaskSource(tasks, None, tmp_path, 2, 0.5, 0),
                    "stdout-json", False)
    # the deadline runs from submission: enough for both tasks to start and the hung one to open its
    # rollout on a loaded CI machine (30 s was not), so that there is a running rollout to fail
    ex = RayExecutor(c.address, concurrency=2, deadline=90)
    try:
        with run_proxy(ProxyConfig(db=str(tmp_path / "runs.db"), backend="local", model=str(tiny_model_dir),
                                   port=0, host=ex.proxy_host)) as proxy:
            results = run_batch(ex, h.run, proxy.url, jobs_for(h, h.train + h.eval, 1, tag, 1.0), "rollouts")
            assert results[0].error is None and results[0].rollout_id
            assert results[1].rollout_id == "" and "90 s rollout deadline" in results[1].error
            # the cancelled task's worker may finish its rollout as failed itself before settle looks
            # (a race); either way it ends failed, which `listed` checks below
            assert settle(proxy.url, tag, results) in (0, 1)
            with HarnessRL(proxy.url) as client:
                listed = {r["id"]: r["status"] for r in client.list_rollouts(run=tag)}
    finally:
        ex.close()
    [hung] = [p for p in (markers / tag).glob("*.start") if p.stem != results[0].rollout_id]
    assert listed == {results[0].rollout_id: "finished", hung.stem: "failed"}
    try:  # the cancelled worker's harness, orphaned: not the test's to leave behind
        os.kill(json.loads(hung.read_text())["pid"], 9)
    except ProcessLookupError:
        pass
