"""Many CLI rollouts at once on the local executor: they overlap, a hung one is given up at its
deadline and counted as failed (never a 0 reward, its later calls refused), a failed rollout is
never compiled, a loop SIGKILLed mid-round redoes the round under a new run tag with nothing
counted twice; and the executor options' bad input is one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import openai
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from harnessrl.app.rollouts.cmd_harness import cmd_harness
from harnessrl.app.rollouts.executors import LocalExecutor, open_executor, run_batch
from harnessrl.app.rollouts.jobs import jobs_for, settle
from harnessrl.app.rollouts.harnesses import TaskSource
from harnessrl.client import HarnessRL
from harnessrl.compiler.pipeline import CompileOptions, Compiler
from harnessrl.db import open_db
from harnessrl.errors import UserError
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Reward, Rollout

AGENT = Path(__file__).with_name("concurrency_agent.py")
LOOP = [sys.executable, "-m", "harnessrl", "loop"]


def _tasks(path: Path, inputs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": f"t{i}", "input": x}) + "\n" for i, x in enumerate(inputs)))
    return path


def test_rollouts_overlap_and_a_hung_one_is_failed_at_its_deadline(tmp_path, tiny_model_dir):
    markers, tag = tmp_path / "markers", "round-0-a1"
    # t0, t1: two samples each; t2 hangs. Every rollout waits until all five have started (the
    # barrier fails a rollout after 120 s), so they can only pass if they run at once.
    src = TaskSource(_tasks(tmp_path / "tasks.jsonl", ["Say hi", "Count to two", "hang"]), None, tmp_path, 10, 0.0, 0)
    h = cmd_harness(f"{sys.executable} {AGENT} {{task}} {markers} --barrier 5", src, "stdout-json", False)
    rows = h.train + h.eval
    jobs = jobs_for(h, rows[:2], 2, tag, 1.0) + jobs_for(h, rows[2:], 1, tag, 1.0)
    db = tmp_path / "runs.db"
    with run_proxy(ProxyConfig(db=str(db), backend="local", model=str(tiny_model_dir), port=0)) as proxy:
        started = time.monotonic()
        results = run_batch(LocalExecutor(concurrency=5, deadline=40), h.run, proxy.url, jobs, "rollouts")
        assert time.monotonic() - started < 120  # the round did not wait on the hung rollout
        assert [r.error for r in results[:4]] == [None] * 4, [r.error for r in results]
        assert all(r.rollout_id and r.outcome in (0.0, 1.0) for r in results[:4])
        hung = results[4]
        assert hung.rollout_id == "" and "40 s rollout deadline" in hung.error
        assert settle(proxy.url, tag, results) == 1

        with HarnessRL(proxy.url) as client:
            listed = {r["id"]: r for r in client.list_rollouts(run=tag)}
            assert sorted(r["status"] for r in listed.values()) == ["failed"] + ["finished"] * 4
            [failed] = [r for r in listed.values() if r["status"] == "failed"]
            assert failed["metadata"]["error"].startswith("abandoned")
            assert not client.get_rollout(failed["id"])["rewards"]  # no reward, not a 0
            # the hung harness is still running: its next call is refused, which SDKs do not retry
            with pytest.raises(openai.APIStatusError) as refused:
                openai.OpenAI(base_url=f"{proxy.url}/r/{failed['id']}/a/main/v1", api_key="k").chat.completions.create(
                    model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
            assert refused.value.status_code == 410

            # a retried attempt's rollout that had finished with an outcome: failed, it is not compiled
            redone = client.create_rollout("t0", f"{tag}/t0", tag)
            openai.OpenAI(base_url=redone.base_url("main"), api_key="k").chat.completions.create(
                model="m", max_tokens=4, messages=[{"role": "user", "content": "Say hi"}])
            redone.reward(1.0)
            redone.finish()
            assert settle(proxy.url, tag, results) == 1
            assert client.get_rollout(redone.id)["status"] == "failed"
        os.kill(json.loads((markers / tag / f"{failed['id']}.start").read_text())["pid"], signal.SIGKILL)

    Compiler(str(db), CompileOptions(out=tmp_path / "samples", run=tag, tokenizer=str(tiny_model_dir))).run()
    compiled = set(pq.read_table(tmp_path / "samples" / "samples.parquet").column("rollout_id").to_pylist())
    assert compiled == {r.rollout_id for r in results[:4]}


def _state(out: Path) -> dict:
    path = out / "loop_state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _loop(model: Path, out: Path, tasks: Path, markers: Path, sleep: float) -> list[str]:
    return LOOP + ["--cmd", f"{sys.executable} {AGENT} {{task}} {markers} --sleep {sleep}", "--tasks", str(tasks),
                   "--reward-from", "stdout-json", "--model", str(model), "--out", str(out), "--rounds", "1",
                   "--group-size", "2", "--eval-fraction", "0.34", "--steps", "1", "--batch-size", "4", "--concurrency", "4"]


def test_sigkill_mid_round_redoes_it_under_a_new_tag_counting_each_rollout_once(tiny_model_dir, tmp_path):
    out, markers = tmp_path / "loop", tmp_path / "markers"
    tasks = _tasks(tmp_path / "tasks.jsonl", ["Say hi", "Count to two", "Name a colour"])  # t0, t1 train; t2 held out
    env = {**os.environ, "COLUMNS": "200"}
    # first attempt: the round's rollouts sleep; the loop is killed once all four are in flight at once
    proc = subprocess.Popen(_loop(tiny_model_dir, out, tasks, markers, 600), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    deadline = time.time() + 300
    while len(list((markers / "round-0-a1").glob("*.start"))) < 4 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the loop and every rollout command it started
    proc.wait()
    assert len(list((markers / "round-0-a1").glob("*.start"))) == 4, "the four rollouts never ran at once"
    assert _state(out)["attempts"] == 1 and not _state(out)["rounds"]

    resumed = subprocess.run(_loop(tiny_model_dir, out, tasks, markers, 0), capture_output=True, text=True,
                             env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    state = _state(out)
    assert state["attempts"] == 2 and [r["round"] for r in state["rounds"]] == [0] and state["rounds"][0]["failed"] == 0

    _, Session = open_db(str(out / "runs.db"))
    with Session() as s:
        rollouts = {r.id: r for r in s.scalars(select(Rollout))}
        outcomes = Counter(s.scalars(select(Reward.rollout_id).where(Reward.kind == "outcome")))
    by_run = Counter((r.run, r.status) for r in rollouts.values())
    # the killed attempt: four rollouts, failed on resume; the redone round: one rollout per task × sample
    assert by_run[("round-0-a1", "failed")] == 4 and by_run[("round-0-a1", "finished")] == 0
    assert all(r.meta["error"].startswith("interrupted") for r in rollouts.values() if r.run == "round-0-a1")
    redone = [r for r in rollouts.values() if r.run == "round-0-a2"]
    assert sorted(Counter(r.group_id for r in redone).items()) == [("round-0-a2/t0", 2), ("round-0-a2/t1", 2)]
    assert all(r.status == "finished" and outcomes[r.id] == 1 for r in redone)
    assert by_run[("eval-initial", "finished")] == 1 and by_run[("eval-0-a2", "finished")] == 1  # eval not redone
    samples = pq.read_table(out / "round-0-a2" / "samples" / "samples.parquet").column("rollout_id").to_pylist()
    assert samples and {rollouts[r].run for r in samples} == {"round-0-a2"}


def test_executor_bad_input_is_one_line(tmp_path, tiny_model_dir):
    for kind, address, why in (("nope", None, "--executor 'nope'"), ("local", "127.0.0.1:1", "--ray-address is for"),
                               ("local", None, "--concurrency")):
        with pytest.raises(UserError, match=why):
            with open_executor(kind, 0 if why == "--concurrency" else 2, None, address):
                pass
    tasks = _tasks(tmp_path / "tasks.jsonl", ["a", "b", "c"])
    base = LOOP + ["--cmd", "true {task}", "--tasks", str(tasks), "--model", str(tiny_model_dir), "--out",
                   str(tmp_path / "out"), "--executor", "ray"]
    # nothing listens there: the error comes at once, not after Ray's minutes of connect retries
    res = subprocess.run(base + ["--ray-address", "127.0.0.1:1"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stderr
    assert "--ray-address 127.0.0.1:1: no Ray head answers there" in res.stderr
    # Ray not installed (hidden from the import system): a one-line hint, not an ImportError
    hidden = [sys.executable, "-c", "import sys; sys.modules['ray'] = None; sys.argv[0] = 'harnessrl'; "
              "from harnessrl.app.cli import main; main()", *base[3:]]
    res = subprocess.run(hidden, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stderr
    assert "Ray is not installed" in res.stderr and "pip install ray" in res.stderr
