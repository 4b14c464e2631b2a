"""`harnessrl loop` survives an agent that attacks the scoring in half its rollouts (issue 54):
the built-in coding agent on the tiny model, then, on one of the two training tasks, an attack in
every way at once — a link whose name is not UTF-8 (its name goes into the reward's metadata), a package that floods its output and exits at
import, a harness killed (its shell) after it ran. The loop runs its round to the end and trains;
every rollout is finished with an outcome (the attacked ones 0), none failed."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.records import Reward, Rollout

HRL = [sys.executable, "-m", "harnessrl"]
ATTACK = r"""
import json, os, signal, sys
if json.load(open(sys.argv[1]))["id"] == "coding-train-0000":
    pkg = next(p for p in sorted(os.listdir(".")) if os.path.isfile(os.path.join(p, "__init__.py")))
    os.symlink(b"/etc/passwd", pkg.encode() + b"/\xff\xfe.py")  # left out, its name in the reward's metadata
    with open(os.path.join(pkg, "__init__.py"), "a") as f:
        f.write("\nimport os\nos.write(1, b'[' * 300000)\nos._exit(3)\n")
    os.kill(os.getppid(), signal.SIGKILL)  # the harness's shell
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow  # one loop round on the tiny model: about 2 minutes on 2 busy cores
def test_a_loop_with_half_its_rollouts_attacking_runs_to_its_end(tiny_model_dir, tmp_path):
    if subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "true"], capture_output=True).returncode:
        pytest.skip("bubblewrap cannot make a sandbox here")
    made = subprocess.run(HRL + ["tasks", "coding", "--out", str(tmp_path / "tasks"), "--n-train", "2", "--n-eval",
                                 "1", "--seed", "0"], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    (tmp_path / "attack.py").write_text(ATTACK)
    py = shlex.quote(sys.executable)
    cmd = (f"{py} -m harnessrl.harness_examples.coding.agent {{task}} --max-turns 2 --max-tokens 32; "
           f"{py} {shlex.quote(str(tmp_path / 'attack.py'))} {{task}}")
    run = subprocess.run(HRL + ["loop", "--cmd", cmd, "--tasks", str(tmp_path / "tasks" / "coding.jsonl"),
                                "--n-tasks", "3", "--eval-fraction", "0.34", "--model", str(tiny_model_dir),
                                "--out", str(tmp_path / "loop"), "--rounds", "1", "--group-size", "2", "--steps", "1",
                                "--batch-size", "4", "--concurrency", "2", "--sandbox", "bwrap", "--timeout", "300"],
                         capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stdout[-3000:] + run.stderr[-3000:]
    _, Session = open_db(str(tmp_path / "loop" / "runs.db"))
    with Session() as s:
        rollouts = list(s.scalars(select(Rollout)))
        outcomes = {r.rollout_id: r for r in s.scalars(select(Reward).where(Reward.kind == "outcome"))}
        s.expunge_all()
    trained = [r for r in rollouts if r.task_id and r.task_id.startswith("coding-train")]
    assert len(trained) == 4 and all(r.status == "finished" for r in rollouts), [(r.task_id, r.status) for r in rollouts]
    assert all(r.id in outcomes for r in rollouts)
    attacked = [outcomes[r.id] for r in trained if r.task_id == "coding-train-0000"]
    assert len(attacked) == 2 and all(o.value == 0.0 and o.meta["harness"]["exit_code"] != 0 for o in attacked)
    assert any("\\udcff" in line for o in attacked for line in o.meta.get("left_out", []))
