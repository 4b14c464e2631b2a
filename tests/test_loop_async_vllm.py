"""Asynchronous RL on the real `vllm serve` (the tier's session server, tests/vllm_server.py).

- A weight push in the middle of two multi-turn sessions (the proxy in prefix mode over an
  upstreams file, as `loop --upstream` runs it; the push through its /harnessrl/weights): the
  calls before it are the base weights', the calls after it carry the new version and their
  log-probs are the new weights' (moved far beyond the tolerance); each session compiles into one
  sample whose calls carry both versions, every token with its own call's behaviour log-prob.
- `harnessrl loop --async --upstream <vllm>`: three optimizer steps pushed into vLLM while rollouts
  go on, the accounting against the DB (test_loop_async.py), and the last evaluation's calls
  served by the last pushed weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import ExitStack

import httpx
import numpy as np
import openai
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from harnessrl.client import HarnessRL
from harnessrl.compiler.pipeline import CompileOptions, Compiler
from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, Rollout, WeightVersion, unpack_ids, unpack_logprobs
from harnessrl.samples import trained_versions
from harnessrl.trainer.push import push_vllm
from test_loop_async import _check_accounting
from test_vllm_serve import LOGPROB_TOL, calls, trainer_logprobs
from test_vllm_upstreams import perturbed
from vllm_server import SERVED

pytestmark = pytest.mark.vllm
TURNS = ["Tell me about {task}.", "And then?", "Say more."]  # the push comes after the second turn


def _lps(call) -> tuple[list[int], list[int], np.ndarray]:
    return (unpack_ids(call.prompt_ids).tolist(), unpack_ids(call.completion_ids).tolist(),
            unpack_logprobs(call.completion_logprobs))


def test_a_push_mid_session_the_calls_after_it_and_the_session_compiled(vllm_url, vllm_model_dir, tmp_path):
    new = perturbed(vllm_model_dir, tmp_path / "v2")
    db = str(tmp_path / "runs.db")
    ups = tmp_path / "upstreams.txt"
    ups.write_text(vllm_url + "\n")
    cfg = ProxyConfig(db=db, upstreams_file=str(ups), prefix=True, tokenizer=str(vllm_model_dir), port=0)
    try:
        with run_proxy(cfg) as proxy, HarnessRL(proxy.url) as hrl, ExitStack() as sessions:
            ros = [sessions.enter_context(hrl.rollout(task_id="paris", group_id="paris")) for _ in range(2)]
            chats = [openai.OpenAI(base_url=ro.base_url("main"), api_key="x", max_retries=0) for ro in ros]
            history: list[list[dict]] = [[], []]
            for turn, text in enumerate(TURNS):
                if turn == 2:  # both sessions open, two turns in: the push drains vLLM and reloads it
                    report = httpx.post(proxy.url + "/harnessrl/weights", json={"path": str(new), "version": "v2"},
                                        timeout=600).json()
                for k, chat in enumerate(chats):
                    history[k].append({"role": "user", "content": text.format(task="paris")})
                    reply = chat.chat.completions.create(model=SERVED, messages=history[k], max_tokens=8,
                                                         temperature=1.0, seed=k, extra_body={"ignore_eos": True})
                    history[k].append({"role": "assistant", "content": reply.choices[0].message.content or ""})
            for k, ro in enumerate(ros):
                ro.reward(float(k))  # a group with an advantage: both sessions are trained
    finally:  # the session's server goes back to the base weights for the tier's other tests
        push_vllm(vllm_url, vllm_model_dir, "base", lora=False)
    assert [u["version"] for u in report["upstreams"]] == ["v2"] and report["upstreams"][0]["drained"], report
    rows = calls(db)
    by_rollout = {ro.id: [c for c in rows if c.rollout_id == ro.id] for ro in ros}
    for mine in by_rollout.values():
        assert [c.status for c in mine] == ["ok"] * 3
        assert [c.weight_version for c in mine] == [None, None, "v2"]  # vLLM's own weights report no version
        for call in mine:  # each call's log-probs are the weights that served it
            prompt, ids, lps = _lps(call)
            weights = new if call.weight_version == "v2" else vllm_model_dir
            assert np.abs(lps - trainer_logprobs(weights, prompt, ids)).max() < LOGPROB_TOL, call.weight_version
        prompt, ids, lps = _lps(mine[2])  # after the push: far from what the base weights give the same tokens
        assert np.abs(trainer_logprobs(vllm_model_dir, prompt, ids) - lps).max() > 20 * LOGPROB_TOL

    out = tmp_path / "compiled"
    totals = Compiler(db, CompileOptions(out=out, tokenizer=str(vllm_model_dir), jobs=1)).run()["totals"]
    samples = pq.read_table(out / "samples.parquet").to_pylist()
    assert totals["samples"] == 2 and {s["rollout_id"] for s in samples} == set(by_rollout)
    for s in samples:  # one sample per session, its three calls on the path, each with its version
        mine = by_rollout[s["rollout_id"]]
        assert s["call_ids"] == [c.id for c in mine] and s["call_versions"] == [None, None, "v2"]
        assert trained_versions(s) == {None, "v2"} and s["weight_version"] == "v2"
        turns, mask = np.asarray(s["turn_index"]), np.asarray(s["loss_mask"], dtype=bool)
        behaviour = np.asarray(s["behaviour_logprob"])
        for call, turn in zip(mine, s["call_turns"]):  # every trained token: its own call's log-prob
            _, ids, lps = _lps(call)
            at = mask & (turns == turn)
            assert at.sum() == len(ids) and np.allclose(behaviour[at], lps, atol=1e-6), (turn, call.weight_version)


def test_async_loop_on_vllm(vllm_url, vllm_model_dir, tmp_path):
    out = tmp_path / "loop"
    cmd = [sys.executable, "-m", "harnessrl", "loop", "--async", "--harness", "lookup", "--model", str(vllm_model_dir),
           "--upstream", vllm_url, "--out", str(out), "--rounds", "1", "--steps", "3", "--group-size", "2",
           "--n-tasks", "6", "--eval-fraction", "0.34", "--groups-per-step", "1", "--concurrency", "1",
           "--max-queued-steps", "1"]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, timeout=600)
    finally:
        push_vllm(vllm_url, vllm_model_dir, "base", lora=False)
    assert run.returncode == 0, run.stderr[-3000:]
    state = _check_accounting(out)
    _, Session = open_db(str(out / "runs.db"))
    with Session() as s:
        runs = {r.id: r.run for r in s.scalars(select(Rollout))}
        rows = list(s.scalars(select(Call)))
        pushed = s.scalars(select(WeightVersion.version).order_by(WeightVersion.id)).all()  # push order
    assert state["totals"]["steps"] == 3 and state["versions"] == [None, *pushed]
    assert [r["version"] for r in state["steps"]] == pushed and len(set(pushed)) == 3
    kept = {r for g in state["groups"].values() for r in g.get("rollouts") or ()}
    kept |= {rid for rid, run in runs.items() if run.startswith("eval-")}
    assert all(c.status == "ok" for c in rows if c.rollout_id in kept)
    versions: dict[str, set] = {}
    for c in rows:
        versions.setdefault(runs[c.rollout_id], set()).add(c.weight_version)
    assert versions["eval-initial"] == {None} and versions["eval-s2-a1"] == {pushed[-1]}
    # the trained groups hold several versions. One rollout in flight and one group queued: a group starts
    # only once the queued one is trained, so the third step's group started after the second step's had
    # been trained, after the first push had returned, however fast vLLM serves (CI saw every group
    # finish before the first push with a deeper queue)
    trained = [g for g in state["groups"].values() if g["status"] == "trained"]
    assert None in trained[0]["versions"] and None not in trained[-1]["versions"], state["groups"]
    # the last push reloaded vLLM: the evaluation's calls are the last checkpoint's log-probs
    last = next(c for c in rows if runs[c.rollout_id] == "eval-s2-a1")
    prompt, ids, lps = _lps(last)
    assert np.abs(lps - trainer_logprobs(state["model"], prompt, ids)).max() < LOGPROB_TOL
    print(f"\nversions per run: {json.dumps({k: sorted(map(str, v)) for k, v in sorted(versions.items())})}")
