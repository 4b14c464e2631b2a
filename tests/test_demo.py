"""`harnessrl demo --tiny` end to end, shrunk to fit a test: the test's tiny model as the base (no build),
a few SFT steps, one round of group 2. The full demo's rise in held-out success is measured in
docs/changelog.md, not here (tests never assert learning or timings); this checks that every stage
runs, the held-out set is the demo's 16 tasks, the last lines say what changed and where the
curves are, and nothing is printed as a warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_demo_runs_every_stage_and_says_what_improved(tiny_model_dir, tmp_path):
    out = tmp_path / "demo"
    res = subprocess.run([sys.executable, "-m", "harnessrl", "demo", "--tiny", "--out", str(out), "--model", str(tiny_model_dir),
                          "--rounds", "1", "--sft-steps", "2", "--group-size", "2"],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    state = json.loads((out / "loop" / "loop_state.json").read_text())
    assert len(state["rounds"]) == 1 and state["initial_eval"] is not None
    last = res.stdout.strip().splitlines()[-4:]
    assert last[0].startswith("held-out success (16 tasks never trained on, greedy)"), last
    assert "calls the asked attribute's tool (action)" in last[1] and "(args)" in last[2]
    assert last[3] == f"learning curves: {out / 'loop' / 'curves.png'}" and (out / "loop" / "curves.png").is_file()
    # no warning spew: transformers' gradient_checkpointing FutureWarning, DataLoader's pin_memory one
    assert "Warning" not in res.stderr and "warn" not in res.stderr.lower(), res.stderr[-3000:]
    assert "Loading weights" not in res.stderr  # nor the weight loading bars of every stage


def test_the_real_recipe_takes_16_and_16_assistant_tasks_and_an_inconsistent_expert(tmp_path):
    from harnessrl.app.demo import demo_tasks
    from harnessrl.app.demo_config import REAL
    from harnessrl.harness_examples.assistant import tasks as assistant

    tasks_file, sft_file, n_train, n_held = demo_tasks(REAL, tmp_path)
    tasks = assistant.read(tasks_file)
    assert (n_train, n_held, len(tasks)) == (16, 16, 32)
    train, held = assistant.generate(0)
    assert tasks == train[:16] + held[:16]  # the loop holds out the file's tail (--eval-fraction 0.5)
    lines = [json.loads(line) for line in sft_file.read_text().splitlines()]
    assert len(lines) == 5 * 16 and {line["id"] for line in lines} == {t.id for t in train[:16]}
    called = [line["expert_trace"][0]["tool_calls"][0]["function"]["name"] for line in lines]
    assert sum(c == t.tool for c, t in zip(called, [t for t in train[:16] for _ in range(5)])) == 2 * 16


def test_a_demo_folder_holds_one_recipe(tmp_path):
    import pytest

    from harnessrl.app.demo import run_demo
    from harnessrl.app.demo_config import REAL, TINY
    from harnessrl.errors import UserError

    (tmp_path / "loop").mkdir()  # a tiny demo's run from before the recipes were marked
    with pytest.raises(UserError, match="holds the tiny demo's run: give another --out"):
        run_demo(tmp_path, REAL)
    (tmp_path / "recipe").write_text("smollm2\n")
    with pytest.raises(UserError, match="holds the smollm2 demo's run"):
        run_demo(tmp_path, TINY)
