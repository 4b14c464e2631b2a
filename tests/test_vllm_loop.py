"""`harnessrl loop --upstream URL` on the real `vllm serve` (the tier's session server): one round
end to end — rollouts through the proxy to vLLM, compile, one training step, the push that reloads
vLLM from the checkpoint, and the held-out calls after it on the new version — then, with vLLM
back on the base weights (as after a restart), a resumed second round that starts on round 0's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.records import Call, Rollout
from harnessrl.trainer.push import push_vllm

pytestmark = pytest.mark.vllm


def test_loop_round_on_vllm(vllm_url, vllm_model_dir, tmp_path):
    out = tmp_path / "loop"

    def loop(rounds: int) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "harnessrl", "loop", "--harness", "lookup", "--model", str(vllm_model_dir),
               "--upstream", vllm_url, "--out", str(out), "--rounds", str(rounds), "--group-size", "2", "--n-tasks", "3",
               "--eval-fraction", "0.34", "--steps", "1", "--batch-size", "4", "--concurrency", "2"]
        try:
            return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"},
                                  timeout=600)
        finally:  # the session's server goes back to the base weights (for the resume, and the other tests)
            push_vllm(vllm_url, vllm_model_dir, "base", lora=False)

    run = loop(1)
    assert run.returncode == 0, run.stderr[-3000:]
    run = loop(2)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "resuming after round 0" in run.stdout
    row, second = json.loads((out / "loop_state.json").read_text())["rounds"]
    _, Session = open_db(str(out / "runs.db"))
    with Session() as s:
        runs = {r.id: r.run for r in s.scalars(select(Rollout))}
        versions: dict[str, set] = {}
        for c in s.scalars(select(Call)):
            versions.setdefault(runs[c.rollout_id], set()).add(c.weight_version)
            assert c.status == "ok" and c.completion_ids, c.error
    # before the push: vLLM's own weights (it reports no version); after it: the round's checkpoint
    assert versions["eval-initial"] == {None} and versions["round-0-a1"] == {None}
    assert versions["eval-0-a1"] == {row["version"]}
    assert row["samples"] >= 2
    # resumed on the base-weight server: round 1's rollouts ran on round 0's checkpoint, pushed again
    assert versions["round-1-a2"] == {row["version"]} and versions["eval-1-a2"] == {second["version"]}
