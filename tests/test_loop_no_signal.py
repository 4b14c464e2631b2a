"""A loop whose rollouts leave nothing to train (here: no model call at all; in practice a tiny
model whose compile masks every token): the round driver keeps its weights and goes on, the
asynchronous one keeps sampling groups, then gives up in one line instead of waiting forever."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def _loop(model: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "input": f"task {i}"}) + "\n" for i in range(4)))
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "harnessrl", "loop", "--harness", "no_model_harness:run", "--tasks",
                           str(tasks), "--model", str(model), "--out", str(tmp_path / "loop"), "--group-size", "2",
                           "--steps", "1", *extra], capture_output=True, text=True, env=env, timeout=600)


def test_a_round_with_nothing_to_train_keeps_its_weights(tiny_model_dir, tmp_path):
    done = _loop(tiny_model_dir, tmp_path, "--rounds", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("no token to train") == 2
    state = json.loads((tmp_path / "loop" / "loop_state.json").read_text())
    assert [(r["version"], r["checkpoint"]) for r in state["rounds"]] == [("base", str(tiny_model_dir))] * 2
    assert state["model"] == str(tiny_model_dir)
    assert not list((tmp_path / "loop").glob("round-*/checkpoints"))  # nothing trained, nothing pushed


def test_an_async_loop_with_nothing_to_train_says_so(tiny_model_dir, tmp_path):
    done = _loop(tiny_model_dir, tmp_path, "--async", "--rounds", "1", "--concurrency", "4")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "the last 50 groups gave nothing to train" in done.stderr and "Traceback" not in done.stderr
    state = json.loads((tmp_path / "loop" / "loop_state.json").read_text())
    assert not state["steps"]
    why = [g.get("why") for g in state["groups"].values() if g["status"] == "failed"]
    assert why.count("no sample") >= 50
    assert not any(g["status"] == "running" for g in state["groups"].values())


def test_an_async_loop_whose_rollouts_all_fail_names_the_error(tiny_model_dir, tmp_path):
    # every command exits 3 (B's find: a --cmd run by the wrong python): the round driver would fail
    # its round; the async one made failed groups for ever
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "input": f"task {i}"}) + "\n" for i in range(4)))
    done = subprocess.run([sys.executable, "-m", "harnessrl", "loop", "--async", "--cmd",
                           f"{sys.executable} -c 'import sys; sys.exit(3)' {{task}}", "--tasks", str(tasks),
                           "--reward-from", "exit-code", "--sandbox", "none", "--model", str(tiny_model_dir), "--out",
                           str(tmp_path / "loop"), "--group-size", "2", "--steps", "1", "--rounds", "1",
                           "--concurrency", "4"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "the last 50 groups gave nothing to train" in done.stderr and "exit code 3" in done.stderr
    assert "Traceback" not in done.stderr
