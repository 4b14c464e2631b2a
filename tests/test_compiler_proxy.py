"""Compile rollouts recorded through the real proxy (local backend, tiny model, openai SDK on a
real socket): a planner with two worker sessions, a single-agent multi-turn rollout, a harness
that compresses its history, a retry, and a streamed call. The tiny model's text is whatever it
samples (temperature 0), so expectations are computed from the recorded ids."""

from __future__ import annotations

import json

import numpy as np
import openai
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from harnessrl.client import HarnessRL
from harnessrl.compiler.response import parse_response
from harnessrl.compiler.tokentext import TokenText
from harnessrl.compiler.pipeline import CompileOptions, Compiler
from harnessrl.samples import ACTION
from harnessrl.db import open_db
from harnessrl.proxy.local.backend import LocalBackend
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, unpack_ids, unpack_logprobs

SYSTEM = {"role": "system", "content": "You are a careful assistant."}
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look something up.", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]


class Harness:
    """A minimal harness: keeps its own message lists and talks to the proxy like any client."""

    def __init__(self, url: str):
        self.url = url

    def chat(self, ro, agent, messages, session=None, parent=None, stream=False, tools=None):
        client = openai.OpenAI(base_url=ro.base_url(agent), api_key="unused", max_retries=0)
        headers = {k: v for k, v in (("X-HarnessRL-Session", session), ("X-HarnessRL-Parent-Call", parent)) if v}
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=messages, max_tokens=10, temperature=0, seed=1, stream=stream,
            extra_headers=headers, **({"tools": tools} if tools else {}))
        call_id = raw.headers["x-harnessrl-call"]
        if not stream:
            return call_id, raw.parse().choices[0].message.model_dump(exclude_none=True)
        content, calls = "", {}
        for chunk in raw.parse():
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for tc in delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": tc.id, "type": "function",
                                                    "function": {"name": "", "arguments": ""}})
                entry["function"]["name"] += tc.function.name or ""
                entry["function"]["arguments"] += tc.function.arguments or ""
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return call_id, message


@pytest.fixture(scope="module")
def recorded(tiny_model_dir, tmp_path_factory):
    """Records the five rollouts once; returns (db, {name: rollout id}, {name: call id})."""
    db = str(tmp_path_factory.mktemp("proxy") / "runs.db")
    backend = LocalBackend(tiny_model_dir, seed=0)
    ids, calls = {}, {}
    try:
        with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0), backend=backend) as proxy:
            h, hrl = Harness(proxy.url), HarnessRL(proxy.url)
            # R1: planner → two worker sessions → planner again
            with hrl.rollout(task_id="t", group_id="g") as ro:
                ids["planner"] = ro.id
                m = [SYSTEM, {"role": "user", "content": "Find the capital and the river of France."}]
                calls["p0"], reply = h.chat(ro, "planner", m, tools=TOOLS)
                calls["w0"], _ = h.chat(ro, "worker", [{"role": "user", "content": "Find the capital of France."}],
                                        session="s1", parent=calls["p0"])
                calls["v0"], _ = h.chat(ro, "worker", [{"role": "user", "content": "Find the river of France."}],
                                        session="s2", parent=calls["p0"])
                m = m + [reply, {"role": "user", "content": "Workers: Paris; Seine."}]
                calls["p1"], _ = h.chat(ro, "planner", m, tools=TOOLS)
                ro.reward(1.0)
            # R2: one agent, three turns
            with hrl.rollout(task_id="t", group_id="g") as ro:
                ids["multi"] = ro.id
                m = [SYSTEM, {"role": "user", "content": "Count with me."}]
                for k in range(3):
                    calls[f"m{k}"], reply = h.chat(ro, "solo", m)
                    m = m + [reply, {"role": "user", "content": f"next {k}"}]
                ro.reward(0.0)
            # R3: the harness drops old turns after two calls (compression)
            with hrl.rollout(task_id="t", group_id="g") as ro:
                ids["compress"] = ro.id
                m = [SYSTEM, {"role": "user", "content": "A long task."}]
                calls["c0"], reply = h.chat(ro, "solo", m)
                m = m + [reply, {"role": "user", "content": "go on"}]
                calls["c1"], reply = h.chat(ro, "solo", m)
                m = [SYSTEM, {"role": "user", "content": "Summary of the work so far: two steps done."}]
                calls["c2"], reply = h.chat(ro, "solo", m)
                m = m + [reply, {"role": "user", "content": "finish"}]
                calls["c3"], _ = h.chat(ro, "solo", m)
                ro.reward(0.5)
            # R4: the second turn is retried with the same messages
            with hrl.rollout(task_id="t", group_id="g") as ro:
                ids["retry"] = ro.id
                m = [SYSTEM, {"role": "user", "content": "Try twice."}]
                calls["r0"], reply = h.chat(ro, "solo", m)
                m = m + [reply, {"role": "user", "content": "again"}]
                calls["r1"], _ = h.chat(ro, "solo", m)
                calls["r2"], _ = h.chat(ro, "solo", m)
                ro.reward(0.0)
            # R5: a streamed call, then a plain follow-up
            with hrl.rollout(task_id="t", group_id="g") as ro:
                ids["stream"] = ro.id
                m = [SYSTEM, {"role": "user", "content": "Stream it."}]
                calls["s0"], reply = h.chat(ro, "solo", m, stream=True)
                m = m + [reply, {"role": "user", "content": "and then?"}]
                calls["s1"], _ = h.chat(ro, "solo", m)
                ro.reward(1.0)
    finally:
        backend.close()
    return db, ids, calls


def db_calls(db):
    engine, make = open_db(db)
    with make() as s:
        rows = {c.id: c for c in s.scalars(select(Call))}
    engine.dispose()
    return rows


# the intended trees, as paths of call names (root first) with the owner flags
PATHS = {
    ("planner", "p1"): (["p0", "p1"], [1, 1]),
    ("planner", "w0"): (["w0"], [1]),
    ("planner", "v0"): (["v0"], [1]),
    ("multi", "m2"): (["m0", "m1", "m2"], [1, 1, 1]),
    ("compress", "c1"): (["c0", "c1"], [1, 1]),
    ("compress", "c3"): (["c2", "c3"], [1, 1]),
    ("retry", "r1"): (["r0", "r1"], [1, 1]),
    ("retry", "r2"): (["r0", "r2"], [0, 1]),
    ("stream", "s1"): (["s0", "s1"], [1, 1]),
}


def test_compile_recorded_rollouts(recorded, tmp_path, tiny_model_dir):
    db, ids, names = recorded
    rows = db_calls(db)
    assert len(rows) == 16 and rows[names["s0"]].stream and all(r.status == "ok" for r in rows.values())
    stats = Compiler(db, CompileOptions(out=tmp_path, train_agents="all", tokenizer=str(tiny_model_dir))).run()
    t = stats["totals"]
    # merges: p1, m1, m2, c1, c3, r1, r2, s1; roots: 7 session starts (planner, s1, s2, and one
    # per single-agent rollout) and the compressed context
    assert (t["samples"], t["merges"], t["roots_start"], t["roots_rewrite"], t["roots_drift"], t["failed"]) == \
        (9, 8, 7, 1, 0, 0)
    samples = {r["sample_id"]: r for r in pq.read_table(tmp_path / "samples.parquet").to_pylist()}
    by_leaf = {s["call_ids"][-1]: s for s in samples.values()}
    # outcomes [1, 0, 0.5, 0, 1] in one group: mean 0.5, sample std 0.5 → A = [1, −1, 0, −1, 1]
    advantage = {"planner": 1, "multi": -1, "compress": 0, "retry": -1, "stream": 1}
    tt = TokenText.from_dir(tiny_model_dir)

    for (rollout, leaf), (path, owned) in PATHS.items():
        s = by_leaf[names[leaf]]
        assert s["rollout_id"] == ids[rollout] and s["call_ids"] == [names[c] for c in path]
        leaf_row = rows[names[leaf]]
        full = np.concatenate([unpack_ids(leaf_row.prompt_ids), unpack_ids(leaf_row.completion_ids)])
        assert s["input_ids"] == full.tolist()
        mask = np.zeros(len(full), dtype=np.int8)
        for name, own in zip(path, owned):
            r = rows[names[name]]
            p, c = unpack_ids(r.prompt_ids), unpack_ids(r.completion_ids)
            assert (full[len(p):len(p) + len(c)] == c).all()  # the path carries the exact ids
            mask[len(p):len(p) + len(c)] = own
            if own:
                got = s["behaviour_logprob"][len(p):len(p) + len(c)]
                assert got == pytest.approx(unpack_logprobs(r.completion_logprobs).tolist(), abs=1e-6)
                # the proxy's parsed tool calls are actions in our classes too
                cls = np.array(s["token_class"][len(p):len(p) + len(c)])
                for call in parse_response(r.response_text or "", r.tool_calls).calls:
                    if call.name:
                        action_text = b"".join(tt.table[i] for i in c[cls == ACTION].tolist()).decode(errors="replace")
                        assert call.name in action_text

        assert s["loss_mask"] == mask.tolist()
        cls = np.array(s["token_class"])
        assert ((cls > 0) == (mask == 1)).all()
        adv = np.array(s["advantage"])
        assert np.allclose(adv[mask == 1], advantage[rollout] * 0.5 / (0.5 + 1e-6), atol=1e-6)
        assert (adv[mask == 0] == 0).all()
    # cross-session edges: the workers name their parent call in a header
    assert json.loads(by_leaf[names["w0"]]["reward_breakdown"])["parent_call"] == names["p0"]
    assert stats["rollouts"][ids["compress"]]["roots_rewrite"] == 1
    assert stats["rollouts"][ids["retry"]]["samples"] == 2


def test_central_scope_trains_the_planner_only(recorded, tmp_path, tiny_model_dir):
    db, ids, names = recorded
    stats = Compiler(db, CompileOptions(out=tmp_path, rollouts=(ids["planner"],), tokenizer=str(tiny_model_dir))).run()
    samples = pq.read_table(tmp_path / "samples.parquet").to_pylist()
    assert [s["call_ids"] for s in samples] == [[names["p0"], names["p1"]]]
    assert stats["totals"]["untrained_sessions"] == 2
    # a single rollout is a group of one: no baseline, advantage 0, counted
    assert set(samples[0]["advantage"]) == {0.0} and stats["totals"]["singleton_groups"] == 1


@pytest.mark.parametrize("flags, trained", [
    ((), {"planner"}),  # grpo: the central agent only
    (("--advantage", "matpo"), {"planner", "worker"}),  # the estimator's algorithm trains every role
    (("--algo", "matpo"), {"planner", "worker"}),
    (("--algo", "matpo", "--train-agents", "central"), {"planner"}),  # an explicit scope wins
    (("--algo", "pact"), {"planner"}),
])
def test_compile_scope_follows_the_algorithm_registry(recorded, tmp_path, tiny_model_dir, flags, trained):
    import subprocess
    import sys

    db, ids, _ = recorded
    done = subprocess.run([sys.executable, "-m", "harnessrl", "compile", "--db", db, "--out", str(tmp_path),
                           "--rollouts", ids["planner"], "--tokenizer", str(tiny_model_dir), *flags],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    agents = {s["agent"] for s in pq.read_table(tmp_path / "samples.parquet").to_pylist()}
    assert agents == trained
