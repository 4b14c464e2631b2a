"""`harnessrl compile` end to end on a records DB written row by row with real tiny-tokenizer
ids: a planner–worker rollout (two worker sessions), a planner with a failed call and a retry,
and a compressing single-agent rollout with a call recorded without ids."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from harnessrl.compiler.advantages import AdvantageConfig
from harnessrl.compiler.pipeline import CompileOptions, Compiler
from harnessrl.samples import ACTION, ARGS, SAMPLE_SCHEMA
from harnessrl.db import open_db
from harnessrl.records import Call, Reward, Rollout, Task, pack_ids, pack_logprobs

TOOLS = [{"type": "function", "function": {"name": "dispatch", "parameters": {
    "type": "object", "properties": {"agent": {"type": "string"}, "task": {"type": "string"}},
    "required": ["agent", "task"]}}}]
R2 = 1 / np.sqrt(2)


class Recorder:
    """Writes calls the way the proxy does: ids from the chat template, prompts that extend the
    previous call's exact ids with the rendered observation."""

    def __init__(self, db, tok):
        _, self.make = open_db(db)
        self.tok = tok
        self.eos = tok.eos_token_id
        self.seq = {}

    def enc(self, text):
        return self.tok.encode(text, add_special_tokens=False)

    def render(self, messages, tools=None):
        return self.enc(self.tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False))

    def rollout(self, rid, task_id, group_id, reward=None):
        with self.make.begin() as s:
            s.add(Rollout(id=rid, task_id=task_id, group_id=group_id, status="finished", next_seq=0,
                          created_at=time.time()))
            s.flush()
            if reward is not None:
                s.add(Reward(rollout_id=rid, kind="outcome", name="outcome", value=reward, created_at=time.time()))

    def call(self, cid, rid, agent, prompt, text, messages, session=None, status="ok", ids=True, tools=None):
        seq = self.seq.get(rid, 0)
        self.seq[rid] = seq + 1
        completion = self.enc(text) + [self.eos]
        logprobs = [-0.01 * (i + 1) for i in range(len(completion))]
        with self.make.begin() as s:
            s.add(Call(id=cid, rollout_id=rid, seq=seq, session_id=session, agent=agent, endpoint="chat",
                       request={"messages": messages, "tools": tools}, response_text=text, status=status,
                       prompt_ids=pack_ids(prompt) if ids and status == "ok" else None,
                       completion_ids=pack_ids(completion) if ids and status == "ok" else None,
                       completion_logprobs=pack_logprobs(logprobs) if ids and status == "ok" else None,
                       weight_version="v0", created_at=time.time(), error=None if status == "ok" else "boom"))
        return list(prompt or []), completion, logprobs

    def extend(self, prompt, completion, observation):
        """The next prompt: S of the previous call, the template's newline, the observation turn."""
        return prompt + completion + self.enc("\n<|im_start|>user\n<tool_response>\n" + observation +
                                              "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


DISPATCH = '<tool_call>\n{"name": "dispatch", "arguments": {"agent": "worker", "task": "find the capital of France"}}\n</tool_call>'
DISPATCH2 = '<tool_call>\n{"name": "dispatch", "arguments": {"agent": "worker", "task": "check the river of Paris"}}\n</tool_call>'


@pytest.fixture
def fixture_db(db_target, tok):
    """Returns (db, expected) where expected holds the recorded ids per call."""
    rec = Recorder(db_target, tok)
    with rec.make.begin() as s:
        s.add(Task(id="t1", input="Capital of France?", reference="Paris",
                   reference_calls=[{"name": "dispatch", "arguments": {"agent": "worker", "task": "find the capital of France"}}],
                   created_at=time.time(),
                   meta=None))
    calls = {}
    # r1: planner dispatches two workers (named sessions), then answers
    rec.rollout("r1", "t1", "g", reward=1.0)
    m0 = [{"role": "system", "content": "Plan."}, {"role": "user", "content": "Capital of France?"}]
    calls["p0"] = rec.call("p0", "r1", "planner", rec.render(m0, TOOLS), DISPATCH + "\n" + DISPATCH2, m0, tools=TOOLS)
    wm = [{"role": "user", "content": "find the capital of France"}]
    calls["w0"] = rec.call("w0", "r1", "worker", rec.render(wm), "<think>\nEasy.\n</think>\n\nParis", wm, session="s1")
    vm = [{"role": "user", "content": "check the river of Paris"}]
    calls["v0"] = rec.call("v0", "r1", "worker", rec.render(vm), "Seine", vm, session="s2")
    m1 = m0 + [{"role": "assistant", "content": DISPATCH}, {"role": "tool", "content": "Paris"},
               {"role": "tool", "content": "Seine"}]
    p1_prompt = rec.extend(calls["p0"][0], calls["p0"][1], "Paris")
    calls["p1"] = rec.call("p1", "r1", "planner", p1_prompt, "<answer>Paris</answer>", m1, tools=TOOLS)
    # r2 (same group): an invalid call, a failed call, a retry of it
    rec.rollout("r2", "t1", "g", reward=0.0)
    q0_text = '<tool_call>\n{"name": "lookup", "arguments": {"key": "france"}}\n</tool_call>'
    calls["q0"] = rec.call("q0", "r2", "planner", rec.render(m0, TOOLS), q0_text, m0, tools=TOOLS)
    q_prompt = rec.extend(calls["q0"][0], calls["q0"][1], "no such tool")
    mq = m0 + [{"role": "assistant", "content": q0_text}, {"role": "tool", "content": "Error: no such tool"}]
    rec.call("qx", "r2", "planner", q_prompt, "", mq, status="error", tools=TOOLS)
    calls["q1"] = rec.call("q1", "r2", "planner", q_prompt, "<answer>Lyon</answer>", mq, tools=TOOLS)
    calls["q2"] = rec.call("q2", "r2", "planner", q_prompt, "<answer>Nice</answer>", mq, tools=TOOLS)
    # r3 (its own group): the harness compresses its history; the last call has no ids
    rec.rollout("r3", "t3", None, reward=0.5)
    c_m0 = [{"role": "system", "content": "Solve."}, {"role": "user", "content": "Long task?"}]
    calls["c0"] = rec.call("c0", "r3", "solo", rec.render(c_m0), "Step one.", c_m0)
    calls["c1"] = rec.call("c1", "r3", "solo", rec.extend(calls["c0"][0], calls["c0"][1], "one"), "Step two.", c_m0)
    c_m2 = [{"role": "system", "content": "Solve."}, {"role": "user", "content": "Summary: steps one and two done."}]
    calls["c2"] = rec.call("c2", "r3", "solo", rec.render(c_m2), "Step three.", c_m2)
    c_m3 = c_m2 + [{"role": "assistant", "content": "Step three."}, {"role": "user", "content": "go on"}]
    rec.call("c3", "r3", "solo", None, "Done.", c_m3, ids=False)
    calls["c3"] = (rec.render(c_m3), rec.enc("Done.") + [rec.eos], None)
    return db_target, calls


def compile_(db, tmp_path, tiny_model_dir, **kw):
    opts = CompileOptions(out=tmp_path / "out", tokenizer=str(tiny_model_dir), **kw)
    stats = Compiler(db, opts).run()
    table = pq.read_table(tmp_path / "out" / "samples.parquet")
    assert table.schema == SAMPLE_SCHEMA
    return stats, {r["sample_id"]: r for r in table.to_pylist()}


def expected_mask(calls, path, owned):
    """Mask 1 on the completion span of every owned call of the path, from the recorded ids."""
    leaf_prompt, leaf_completion, _ = calls[path[-1]]
    mask = np.zeros(len(leaf_prompt) + len(leaf_completion), dtype=np.int8)
    for cid, own in zip(path, owned):
        p, c, _ = calls[cid]
        assert (np.array(leaf_prompt + leaf_completion)[len(p):len(p) + len(c)] == c).all()
        mask[len(p):len(p) + len(c)] = own
    return mask.tolist()


def test_compile_grpo_central(fixture_db, tmp_path, tiny_model_dir, tok):
    db, calls = fixture_db
    stats, samples = compile_(db, tmp_path, tiny_model_dir)
    t = stats["totals"]
    # 12 calls recorded, 1 failed; r1's two worker sessions are not trained (central scope)
    assert (t["calls"], t["failed"], t["retokenized"], t["untrained_sessions"]) == (12, 1, 1, 2)
    assert sorted(samples) == ["r1/agent:planner/p1", "r2/agent:planner/q1", "r2/agent:planner/q2",
                               "r3/agent:solo/c1", "r3/agent:solo/c3"]
    # merges: p1→p0, q1→q0, q2→q0, c1→c0, c3→c2 (re-rendered, still a prefix); roots: 5 session
    # starts (planner, s1, s2 in r1; r2; r3) and c2 rewritten by compression
    assert (t["merges"], t["roots_start"], t["roots_rewrite"], t["roots_drift"]) == (5, 5, 1, 0)
    s = samples["r1/agent:planner/p1"]
    assert s["input_ids"] == calls["p1"][0] + calls["p1"][1]
    assert s["loss_mask"] == expected_mask(calls, ["p0", "p1"], [1, 1])
    assert s["call_ids"] == ["p0", "p1"] and s["prompt_len"] == len(calls["p0"][0])
    # grpo: group g has outcomes [1, 0] → ±1/√2 on trainable tokens, 0 elsewhere
    adv = np.array(s["advantage"])
    mask = np.array(s["loss_mask"])
    assert np.allclose(adv[mask == 1], R2, atol=1e-5) and (adv[mask == 0] == 0).all()
    # behaviour log-probs: the recorded ones on trainable tokens, null elsewhere
    blp = s["behaviour_logprob"]
    n0 = len(calls["p0"][0])
    assert blp[n0:n0 + len(calls["p0"][1])] == pytest.approx(calls["p0"][2])
    assert all(v is None for v, m in zip(blp, mask) if m == 0)
    # classes only on trainable tokens; the dispatched sub-agents are actions, the sub-tasks args
    cls = np.array(s["token_class"])
    assert ((cls > 0) == (mask == 1)).all()
    ids = np.array(s["input_ids"])
    p0_span = slice(n0, n0 + len(calls["p0"][1]))
    text_of = lambda k: tok.decode(ids[p0_span][cls[p0_span] == k].tolist())  # noqa: E731
    assert text_of(ACTION) == "dispatchworkerdispatchworker"
    assert text_of(ARGS) == "find the capital of Francecheck the river of Paris"
    assert s["turn_index"][n0] == 0 and s["turn_index"][len(calls["p1"][0])] == 1 and s["turn_index"][0] == -1
    # the retry: q0's tokens train in the first path only
    assert samples["r2/agent:planner/q1"]["loss_mask"] == expected_mask(calls, ["q0", "q1"], [1, 1])
    assert samples["r2/agent:planner/q2"]["loss_mask"] == expected_mask(calls, ["q0", "q2"], [0, 1])
    assert np.allclose([a for a, m in zip(samples["r2/agent:planner/q2"]["advantage"],
                                          samples["r2/agent:planner/q2"]["loss_mask"]) if m], -R2, atol=1e-5)
    # compression: two samples; the retokenized one is flagged, has no behaviour log-probs
    c3 = samples["r3/agent:solo/c3"]
    assert c3["retokenized"] and not samples["r3/agent:solo/c1"]["retokenized"]
    assert c3["input_ids"] == calls["c3"][0] + calls["c3"][1]
    assert c3["loss_mask"] == expected_mask(calls, ["c2", "c3"], [1, 1])
    assert all(v is None for v in c3["behaviour_logprob"][len(calls["c3"][0]):])
    n2 = len(calls["c2"][0])
    assert c3["behaviour_logprob"][n2:n2 + len(calls["c2"][1])] == pytest.approx(calls["c2"][2])
    # r3 is a group of one: no baseline, advantage 0 by default, and it is counted
    assert set(c3["advantage"]) == {0.0} and t["singleton_groups"] == 1
    # token saving = Σ|S_c| / emitted tokens, from the recorded ids
    recorded = sum(len(c[0]) + len(c[1]) for c in calls.values())
    emitted = sum(len(x["input_ids"]) for x in samples.values())
    # the workers' S are recorded but not emitted (untrained)
    assert t["tokens_recorded"] == recorded and t["tokens_emitted"] == emitted
    assert t["token_saving"] == pytest.approx(recorded / emitted)
    # tasks.parquet: the tasks that have samples
    tasks = pq.read_table(tmp_path / "out" / "tasks.parquet").to_pylist()
    assert [x["task_id"] for x in tasks] == ["t1"] and json.loads(tasks[0]["reference"]) == "Paris"
    assert json.loads(samples["r1/agent:planner/p1"]["reward_breakdown"])["parent_call"] is None


def test_compile_all_agents_and_edges(fixture_db, tmp_path, tiny_model_dir):
    db, calls = fixture_db
    stats, samples = compile_(db, tmp_path, tiny_model_dir, train_agents="all")
    assert stats["totals"]["samples"] == 7
    w0 = samples["r1/session:s1/w0"]
    assert w0["agent"] == "worker" and w0["session_id"] == "s1"
    assert json.loads(w0["reward_breakdown"])["parent_call"] == "p0"
    assert json.loads(samples["r1/session:s2/v0"]["reward_breakdown"])["parent_call"] == "p0"
    assert w0["loss_mask"] == expected_mask(calls, ["w0"], [1])


def test_compile_harness_with_process_rewards(fixture_db, tmp_path, tiny_model_dir):
    db, _ = fixture_db
    _, samples = compile_(db, tmp_path, tiny_model_dir, advantage="harness", process=("tool_format", "dispatch_ok"))
    # unit process reward = mean(tool_format, dispatch_ok): p0 (valid dispatches; results Paris,
    # Seine) = 1; q0 calls an unknown tool: tool_format 0, its result is an error: 0 → 0.
    # Turn 0 bucket (planner, 0) over [1, 0] → ±1/√2; turn 1 (p1, q1, q2 all 1) → 0.
    # A = Â ± 0.1·Ã: p0 = 1/√2 + 0.1/√2 = 0.777817; p1 = 0.707107; q1 = q2 = −0.707107
    def advs(sid):
        s = samples[sid]
        return sorted({round(a, 5) for a, m in zip(s["advantage"], s["loss_mask"]) if m})
    assert advs("r1/agent:planner/p1") == [round(R2, 5), round(1.1 * R2, 5)]
    assert advs("r2/agent:planner/q1") == [round(-1.1 * R2, 5), round(-R2, 5)]
    assert advs("r2/agent:planner/q2") == [round(-R2, 5)]  # q0 is owned by the first path
    process = json.loads(samples["r2/agent:planner/q1"]["reward_breakdown"])["process"]
    assert process["q0"] == {"tool_format": 0.0, "dispatch_ok": 0.0}


def test_compile_outcome_function_and_matpo(fixture_db, tmp_path, tiny_model_dir):
    db, _ = fixture_db
    stats, samples = compile_(db, tmp_path, tiny_model_dir, reward="exact_match", advantage="matpo", train_agents="all")
    per = stats["rollouts"]
    # exact match of the planner's final answer: r1 "Paris" = 1, r2's last answer "Nice" = 0,
    # r3 "Done." vs no task reference = 0
    assert (per["r1"]["outcome"], per["r2"]["outcome"], per["r3"]["outcome"]) == (1.0, 0.0, 0.0)
    # matpo: r1 R = 0.9 + 0.1·(0.5·1 + 0.5·1) = 1.0; r2 R = 0.1·0.5·mean(0, 1, 1) = 0.0333; the
    # paper's group, the 2 planner rollouts: two values, A = ±1/√2, +0.70711 for r1, broadcast to the
    # workers' samples too (matpo_norm: turns counts r1 3 times with its 2 workers: +0.5)
    for sid in ("r1/agent:planner/p1", "r1/session:s1/w0", "r1/session:s2/v0"):
        s = samples[sid]
        assert np.allclose([a for a, m in zip(s["advantage"], s["loss_mask"]) if m], 0.70711, atol=1e-5)


def test_compile_matchtir(fixture_db, tmp_path, tiny_model_dir):
    db, _ = fixture_db
    _, samples = compile_(db, tmp_path, tiny_model_dir, advantage="matchtir")
    # r1 turns: p0 calls dispatch twice vs one reference call: the first matches exactly
    # (1 + 1 + 2)/(2 + 2) = 1, the second: same keys, agent equal → (1 + 1 + 1)/4 = 0.75 but the
    # reference is taken → 0; turn reward mean(1, 0) = 0.5; p1 final answer F1("Paris") = 1.
    # r2 turns: q0 (lookup ≠ dispatch) 0; q1, q2: answers "Lyon"/"Nice" F1 0; the final-answer
    # turn is the last unit. R: r1 = 1.5, r2 = 0 → A^g ±1/√2.
    # G (γ = 0.9): r1 [0.5 + 0.9, 1] = [1.4, 1]; r2 [0, 0, 0] → A^l ±1/√2 at t0 and t1, r2's t2 alone: 0.
    s = samples["r1/agent:planner/p1"]
    assert np.allclose([a for a, m in zip(s["advantage"], s["loss_mask"]) if m], 2 * R2, atol=1e-5)
    process = json.loads(s["reward_breakdown"])["process"]
    assert process["p0"]["matchtir"] == 0.5 and process["p1"]["matchtir"] == 1.0


def run_cli(*args):
    env = {**os.environ, "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-c", "from harnessrl.app.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=180, env=env)


def cli_in_process(monkeypatch, capsys, *args):
    """The `harnessrl` entry point in this process (fast): exit code, stdout, stderr."""
    from harnessrl.app.cli import main

    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", ["harnessrl", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_compile_inspect_and_errors(tmp_path, tiny_model_dir, tok, monkeypatch, capsys):
    db = str(tmp_path / "runs.db")
    rec = Recorder(db, tok)
    rec.rollout("r", None, None, reward=1.0)
    m = [{"role": "user", "content": "hi"}]
    a = rec.call("a", "r", "solo", rec.render(m), "<think>\nhm\n</think>\n\n<answer>ok</answer>", m)
    rec.call("b", "r", "solo", rec.extend(a[0], a[1], "x"), "bye", m)
    rec.call("c", "r", "solo", rec.render([{"role": "user", "content": "other"}]), "new", m)
    out = tmp_path / "out"
    res = run_cli("compile", "--db", db, "--out", str(out), "--tokenizer", str(tiny_model_dir))
    assert res.returncode == 0, res.stderr
    assert "compile summary" in res.stdout and "token saving" in res.stdout
    assert json.loads((out / "stats.json").read_text())["totals"]["samples"] == 2
    code, stdout, _ = cli_in_process(monkeypatch, capsys, "inspect", "--db", db, "--rollout", "r", "--tokenizer",
                                     str(tiny_model_dir))
    assert code == 0
    assert "merge: extends a" in stdout and "break: new root (rewrite)" in stdout
    for args, message in [
        (("compile", "--db", str(tmp_path / "nope.db")), "records DB not found"),
        (("compile", "--db", db, "--advantage", "ppo"), "unknown advantage estimator 'ppo'"),
        (("compile", "--db", db, "--reward", "bleu"), "unknown reward function 'bleu'"),
        (("compile", "--db", db, "--process", "tool_format,speed"), "unknown process reward 'speed'"),
        (("compile", "--db", db, "--since", "yesterday"), "--since 'yesterday'"),
        (("compile", "--db", db, "--out", str(out)), "no tokenizer"),
        (("inspect", "--db", db, "--rollout", "zzz", "--tokenizer", str(tiny_model_dir)), "no rollout 'zzz'"),
    ]:
        code, _, err = cli_in_process(monkeypatch, capsys, *args)
        assert code == 2, (args, err)
        assert message in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1


def test_filters_and_reported_process_rewards(fixture_db, tmp_path, tiny_model_dir):
    db, _ = fixture_db
    _, only = compile_(db, tmp_path, tiny_model_dir, rollouts=("r1",))
    assert sorted(only) == ["r1/agent:planner/p1"]
    stats, none = compile_(db, tmp_path, tiny_model_dir, since=str(time.time() + 3600))
    assert (stats["totals"]["rollouts"], len(none)) == (0, 0)
    # --singleton raw: the group of one gets its raw outcome, 0.5 / (1 + 1e-6)
    stats, raw = compile_(db, tmp_path, tiny_model_dir, adv_config=AdvantageConfig(singleton="raw"))
    assert max(raw["r3/agent:solo/c3"]["advantage"]) == pytest.approx(0.5 / (1 + 1e-6))
    assert stats["options"]["adv_config"]["singleton"] == "raw" and stats["totals"]["singleton_groups"] == 1
    stats, _ = compile_(db, tmp_path, tiny_model_dir, run="no-such-run")
    assert stats["totals"]["rollouts"] == 0
    # a process reward the harness reported for q1 (planner, turn 1) and nothing else: the
    # (planner, 1) bucket holds only it: a bucket of one → Ã = 0, A(q1) = −1/√2 (counted as a
    # singleton bucket); with --singleton raw Ã = 0.25/(1 + 1e-6), A(q1) = −1/√2 + 0.1·Ã
    _, make = open_db(db)
    with make.begin() as s:
        s.add(Reward(rollout_id="r2", call_id="q1", kind="process", name="judge", value=0.25, created_at=time.time()))
    for singleton, want in (("zero", -R2), ("raw", -R2 + 0.1 * 0.25 / (1 + 1e-6))):
        stats, samples = compile_(db, tmp_path, tiny_model_dir, advantage="harness",
                                  adv_config=AdvantageConfig(singleton=singleton))
        s = samples["r2/agent:planner/q1"]
        assert json.loads(s["reward_breakdown"])["process"] == {"q1": {"judge": 0.25}}
        q1_adv = [a for a, m, t in zip(s["advantage"], s["loss_mask"], s["turn_index"]) if m and t == 1]
        assert q1_adv and np.allclose(q1_adv, want, atol=1e-6)
        assert stats["totals"]["singleton_buckets"] == 1


def test_compile_jobs_same_output_as_one_process(fixture_db, tmp_path, tiny_model_dir, monkeypatch):
    """`--jobs 2` over batches of one group each writes the same samples, in the same order, and
    the same stats as a one-process compile."""
    from harnessrl.compiler import parallel

    db, _ = fixture_db
    used = []
    real = parallel.map_batches
    monkeypatch.setattr(parallel, "map_batches", lambda *a: used.append(a[-1]) or real(*a))
    outs = {}
    for jobs in (1, 2):
        opts = CompileOptions(out=tmp_path / f"j{jobs}", tokenizer=str(tiny_model_dir), jobs=jobs,
                              batch_rollouts=1, advantage="harness", process=("tool_format",))
        stats = Compiler(db, opts).run()
        stats["totals"].pop("seconds")
        outs[jobs] = (pq.read_table(tmp_path / f"j{jobs}" / "samples.parquet"), stats,
                      pq.read_table(tmp_path / f"j{jobs}" / "tasks.parquet"))
    (t1, s1, k1), (t2, s2, k2) = outs[1], outs[2]
    assert used == [2]  # the second compile ran in two worker processes
    assert t1.num_rows >= 5
    assert t1.equals(t2)
    assert s1 == s2
    assert k1.equals(k2)
