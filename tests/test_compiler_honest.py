"""Issue 9 ("honest training data"), each case on a hand-built records DB with real tiny-tokenizer
ids and the numbers worked out by hand: rollouts without an outcome, `dispatch_ok` after a new
root, MATPO's format terms as success rates against the tools schema, the advantage constants
from a file, and a tokenizer that does not cover the recorded ids."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_compiler_pipeline import Recorder, cli_in_process

from harnessrl.compiler.pipeline import CompileOptions, Compiler
from harnessrl.compiler.summary import summary_notes
from harnessrl.db import open_db
from harnessrl.errors import UserError
from harnessrl.records import Call, pack_ids

R2 = 1 / np.sqrt(2)
PTOOLS = [{"type": "function", "function": {"name": "dispatch", "parameters": {
    "type": "object", "properties": {"agent": {"type": "string"}, "task": {"type": "string"}},
    "required": ["agent", "task"]}}}]
WTOOLS = [{"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def compile_(db, out, tiny_model_dir, **kw):
    stats = Compiler(db, CompileOptions(out=out, tokenizer=str(tiny_model_dir), **kw)).run()
    return stats, {r["sample_id"]: r for r in pq.read_table(out / "samples.parquet").to_pylist()}


def trained_advantages(sample):
    return sorted({round(a, 5) for a, m in zip(sample["advantage"], sample["loss_mask"]) if m})


def tool_call(name, args):
    return '<tool_call>\n' + json.dumps({"name": name, "arguments": args}) + '\n</tool_call>'


def solo(rec, rid, reward, text="<answer>x</answer>", group="g"):
    rec.rollout(rid, "t", group, reward=reward)
    m = [{"role": "user", "content": f"question {rid}"}]
    rec.call(f"{rid}-c", rid, "solo", rec.render(m), text, m)


def test_missing_outcome_is_left_out_by_default(tmp_path, tiny_model_dir, tok, monkeypatch, capsys):
    db = str(tmp_path / "runs.db")
    rec = Recorder(db, tok)
    solo(rec, "a", 1.0)
    solo(rec, "b", 0.0)
    solo(rec, "c", None)  # the harness never reported an outcome
    # skip (default): the group is [a=1, b=0] → ±1/√2; c has no sample and is counted
    stats, samples = compile_(db, tmp_path / "skip", tiny_model_dir)
    assert sorted(samples) == ["a/agent:solo/a-c", "b/agent:solo/b-c"]
    assert trained_advantages(samples["a/agent:solo/a-c"]) == [round(R2, 5)]
    assert trained_advantages(samples["b/agent:solo/b-c"]) == [round(-R2, 5)]
    t = stats["totals"]
    assert (t["no_outcome"], t["skipped_no_outcome"], t["rollouts"]) == (1, 1, 3)
    assert stats["rollouts"]["c"]["outcome"] is None and stats["options"]["missing_outcome"] == "skip"
    assert "1 rollouts had no outcome reward: left out" in summary_notes(stats)[0]
    # zero (the old behaviour): [1, 0, 0]: mean 1/3, sample std √(((2/3)² + 2·(1/3)²)/2) = √(1/3)
    # = 0.577350 → a = (2/3)/0.577350 = 1.154701, b = c = −(1/3)/0.577350 = −0.577350
    stats, samples = compile_(db, tmp_path / "zero", tiny_model_dir, missing_outcome="zero")
    assert trained_advantages(samples["a/agent:solo/a-c"]) == [1.1547]
    assert trained_advantages(samples["c/agent:solo/c-c"]) == [-0.57735]
    assert stats["totals"]["skipped_no_outcome"] == 0 and stats["totals"]["no_outcome"] == 1
    # matchtir does not use the outcome: nothing is left out
    stats, _ = compile_(db, tmp_path / "m", tiny_model_dir, advantage="matchtir")
    assert stats["totals"]["skipped_no_outcome"] == 0 and stats["totals"]["samples"] == 3
    # the console says so
    code, out, _ = cli_in_process(monkeypatch, capsys, "compile", "--db", db, "--out", str(tmp_path / "cli"),
                                  "--tokenizer", str(tiny_model_dir))
    assert code == 0 and "1 rollouts had no outcome reward: left out of the group statistics" in out
    code, _, err = cli_in_process(monkeypatch, capsys, "compile", "--db", db, "--missing-outcome", "drop")
    assert code == 2 and "--missing-outcome 'drop': use skip or zero" in err


def test_dispatch_ok_reads_the_result_after_a_new_root(tmp_path, tiny_model_dir, tok):
    db = str(tmp_path / "runs.db")
    rec = Recorder(db, tok)
    rec.rollout("r", "t", "g", reward=1.0)
    m0 = [{"role": "system", "content": "Solve."}, {"role": "user", "content": "Where is the key?"}]
    look = tool_call("search", {"q": "key"})
    rec.call("x0", "r", "solo", rec.render(m0, WTOOLS), look, m0, tools=WTOOLS)
    # the harness compresses its history before the next call: x1 is a new (rewrite) root, and
    # its request shows x0's call and the tool's error
    m1 = [{"role": "system", "content": "Solve."}, {"role": "user", "content": "Summary: looked for the key."},
          {"role": "assistant", "content": look}, {"role": "tool", "content": "Error: no such key"}]
    rec.call("x1", "r", "solo", rec.render(m1, WTOOLS), "<answer>lost</answer>", m1, tools=WTOOLS)
    stats, samples = compile_(db, tmp_path / "out", tiny_model_dir, process=("dispatch_ok",))
    assert stats["totals"]["roots_rewrite"] == 1
    # x0 made 1 call, its 1 result is an error → 0/1 = 0 (before: no child in the tree → 1.0);
    # x1 makes no call → 1.0
    assert json.loads(samples["r/agent:solo/x0"]["reward_breakdown"])["process"] == {"x0": {"dispatch_ok": 0.0}}
    assert json.loads(samples["r/agent:solo/x1"]["reward_breakdown"])["process"] == {"x1": {"dispatch_ok": 1.0}}


def test_unnamed_worker_sessions_turn_indices(tmp_path, tiny_model_dir, tok):
    db = str(tmp_path / "runs.db")
    rec = Recorder(db, tok)
    rec.rollout("r", "t", "g", reward=1.0)
    m0 = [{"role": "user", "content": "Plan it."}]
    p0 = rec.call("p0", "r", "planner", rec.render(m0, PTOOLS),
                  tool_call("dispatch", {"agent": "worker", "task": "first sub-task"}), m0, tools=PTOOLS)
    wm = [{"role": "user", "content": "first sub-task"}]
    w0 = rec.call("w0", "r", "worker", rec.render(wm), "step", wm)
    rec.call("w1", "r", "worker", rec.extend(w0[0], w0[1], "obs"), "done one", wm)
    rec.call("p1", "r", "planner", rec.extend(p0[0], p0[1], "done one"),
             tool_call("dispatch", {"agent": "worker", "task": "second sub-task"}), m0, tools=PTOOLS)
    vm = [{"role": "user", "content": "second sub-task"}]
    rec.call("v0", "r", "worker", rec.render(vm), "done two", vm)
    stats, samples = compile_(db, tmp_path / "out", tiny_model_dir, train_agents="all")
    assert stats["totals"]["sessions"] == 3
    # the second unnamed worker's first call is turn 0 of its own session (it was turn 2)
    v0 = samples["r/agent:worker#2/v0"]
    assert {t for t, m in zip(v0["turn_index"], v0["loss_mask"]) if m} == {0}
    w1 = samples["r/agent:worker/w1"]
    assert sorted({t for t, m in zip(w1["turn_index"], w1["loss_mask"]) if m}) == [0, 1]


def test_matpo_format_terms_are_success_rates_against_the_schema(tmp_path, tiny_model_dir, tok):
    db = str(tmp_path / "runs.db")
    rec = Recorder(db, tok)
    ok = tool_call("dispatch", {"agent": "worker", "task": "find it now"})
    short = tool_call("dispatch", {"agent": "worker"})  # parses, but "task" is required
    search_ok, search_bad = tool_call("search", {"q": "x"}), tool_call("search", {"q": 5})  # q must be a string
    m = [{"role": "user", "content": "Plan."}]

    def planner(rid, texts):
        prompt = rec.render(m, PTOOLS)
        for k, text in enumerate(texts):
            got = rec.call(f"{rid}p{k}", rid, "planner", prompt, text, m, tools=PTOOLS)
            prompt = rec.extend(got[0], got[1], "result")

    def worker(rid, session, texts):
        wm = [{"role": "user", "content": f"find it now ({session})"}]
        prompt = rec.render(wm, WTOOLS)
        for k, text in enumerate(texts):
            got = rec.call(f"{rid}{session}{k}", rid, "worker", prompt, text, wm, session=session, tools=WTOOLS)
            prompt = rec.extend(got[0], got[1], "result")

    # A: planner attempts 3 calls, 2 valid → fmt_p = 2/3 (the old per-turn mean: (½ + 1 + 1)/3 = 5/6);
    #    workers s1 (1/1) and s2 (0/1) → fmt_w = ½; acc 1: R = 0.9 + 0.1·(½·⅔ + ½·½) = 0.958333
    rec.rollout("A", "t", "g", reward=1.0)
    planner("A", [ok + short, ok, "<answer>Paris</answer>"])
    worker("A", "s1", [search_ok])
    worker("A", "s2", [search_bad])
    # B: one call to a tool not in the schema → fmt_p = 0/1 = 0 (only JSON checked before: 1);
    #    no worker → fmt_w = 0; acc 0: R = 0
    rec.rollout("B", "t", "g", reward=0.0)
    planner("B", [tool_call("lookup", {"key": "france"}), "<answer>Lyon</answer>"])
    # C: fmt_p = 1/1; worker s3: a valid call, then a body that is not JSON → ½; acc 0:
    #    R = 0.1·(½·1 + ½·½) = 0.075
    rec.rollout("C", "t", "g", reward=0.0)
    planner("C", [ok, "<answer>Nice</answer>"])
    worker("C", "s3", [search_ok, "<tool_call>\n{not json\n</tool_call>"])
    # R = [0.958333, 0, 0.075] over the paper's group, the 3 planner rollouts: mean .344444,
    # deviations .613889 −.344444 −.269444, sample var (.376860 + .118642 + .072600)/2 = .284051,
    # std .532965 → A = 1.151837, −0.646279, −0.505557, broadcast to planner and workers. (Over
    # G×(T+1), matpo_norm: turns — A with 2 workers counts 3 times, B once, C twice — it is
    # .911489, −1.011837, −.861315.)
    _, samples = compile_(db, tmp_path / "out", tiny_model_dir, advantage="matpo", train_agents="all")
    want = {"A": 1.151837, "B": -0.646279, "C": -0.505557}
    for sid, s in samples.items():
        assert trained_advantages(s) == pytest.approx([want[s["rollout_id"]]], abs=2e-5), sid
    assert {s["rollout_id"] for s in samples.values()} == {"A", "B", "C"}
    assert "A/session:s2/As20" in samples


def test_adv_config_file_and_flags_reach_stats(tmp_path, tiny_model_dir, tok, monkeypatch, capsys):
    db = str(tmp_path / "runs.db")
    rec = Recorder(db, tok)
    solo(rec, "a", 1.0)
    solo(rec, "b", 0.0)
    solo(rec, "c", 0.0)
    cfg = tmp_path / "adv.yaml"
    cfg.write_text("std: population\neps: 0.5\nlambda_proc: 0.3\ngamma: 0.8\nalpha: 0.5\nlambda_pen: 0.2\n")
    out = tmp_path / "out"
    code, _, err = cli_in_process(monkeypatch, capsys, "compile", "--db", db, "--out", str(out), "--tokenizer",
                                  str(tiny_model_dir), "--adv-config", str(cfg), "--singleton", "raw")
    assert code == 0, err
    stats = json.loads((out / "stats.json").read_text())
    assert stats["options"]["adv_config"] == {"std": "population", "eps": 0.5, "lambda_proc": 0.3, "proc_norm": "index",
                                              "matpo_acc": 0.9, "matpo_fmt": 0.1, "matpo_norm": "planner",
                                              "gamma": 0.8, "alpha": 0.5,
                                              "lambda_pen": 0.2, "singleton": "raw"}
    # [1, 0, 0]: mean 1/3, population std √(2/9) = 0.471405; a = (2/3)/(0.471405 + 0.5) = 0.686292
    s = pq.read_table(out / "samples.parquet").to_pylist()
    assert trained_advantages(next(x for x in s if x["rollout_id"] == "a")) == [pytest.approx(0.686292, abs=1e-5)]
    # a flag overrides the file
    code, _, _ = cli_in_process(monkeypatch, capsys, "compile", "--db", db, "--out", str(out), "--tokenizer",
                                str(tiny_model_dir), "--adv-config", str(cfg), "--std", "sample")
    assert json.loads((out / "stats.json").read_text())["options"]["adv_config"]["std"] == "sample"
    bad_json = tmp_path / "adv.json"
    bad_json.write_text('{"gamma": "high"}')
    (tmp_path / "typo.yaml").write_text("gama: 0.5\n")
    (tmp_path / "broken.yaml").write_text("gamma: [1\n")
    for args, message in [
        (("--adv-config", str(bad_json)), "gamma must be a number, got 'high'"),
        (("--adv-config", str(tmp_path / "typo.yaml")), "unknown field 'gama'"),
        (("--adv-config", str(tmp_path / "broken.yaml")), "not valid YAML"),
        (("--adv-config", str(tmp_path / "none.yaml")), "No such file"),
        (("--singleton", "one"), "singleton='one': use zero or raw"),
        (("--std", "mad"), "std='mad': use sample or population"),
        (("--unmarked-answer", "final"), "unmarked answer class 'final'"),
    ]:
        code, _, err = cli_in_process(monkeypatch, capsys, "compile", "--db", db, *args)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (args, err)


def test_tokenizer_that_does_not_cover_the_recorded_ids(tmp_path, tiny_model_dir, tok):
    db = str(tmp_path / "runs.db")
    rec = Recorder(db, tok)
    solo(rec, "a", 1.0)
    _, make = open_db(db)
    vocab = len(tok)
    with make.begin() as s:  # as if recorded with a model whose vocabulary is larger
        s.get(Call, "a-c").completion_ids = pack_ids([5, vocab + 7, 6])
    with pytest.raises(UserError, match=f"token id {vocab + 7} of call a-c is outside the vocabulary of the "
                                        f"tokenizer {tiny_model_dir} \\({vocab} tokens\\)"):
        compile_(db, tmp_path / "out", tiny_model_dir)


def test_unknown_estimator_is_a_clear_error(tmp_path):
    db = tmp_path / "runs.db"
    open_db(str(db))
    with pytest.raises(UserError, match="unknown advantage estimator 'ppo': use grpo, harness, matpo, matchtir"):
        Compiler(str(db), CompileOptions(advantage="ppo"))



def test_a_scorer_scored_rollout_without_an_outcome_is_reported_as_an_error(tmp_path, tiny_model_dir, tok):
    """Issue 54: a rollout whose outcome is harnessrl's scorer's (hidden tests, --reward-from) always
    gets one, whatever its harness did; finished without one, it is the scorer's fault, and compile
    says so, never skipping it in silence. A harness's own rollout without one stays a plain note."""
    from harnessrl.records import Rollout

    db = str(tmp_path / "runs.db")
    rec = Recorder(db, tok)
    solo(rec, "a", 1.0)
    solo(rec, "b", 0.0)
    solo(rec, "c", None)
    solo(rec, "d", None)
    with rec.make.begin() as s:
        s.get(Rollout, "d").meta = {"outcome_by": "scorer"}
    stats, samples = compile_(db, tmp_path / "out", tiny_model_dir)
    assert stats["totals"]["scorer_no_outcome"] == 1 and stats["rollouts"]["d"]["scorer_no_outcome"] == 1
    assert stats["totals"]["skipped_no_outcome"] == 2 and "d/agent:solo/d-c" not in samples
    [error, *_] = summary_notes(stats)
    assert error.startswith("error: 1 rollouts that harnessrl's scorer scores") and "(d)" in error and "left out" in error
