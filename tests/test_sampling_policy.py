"""The sampling policy: pure rules (core), enforced by a real proxy in front of the vLLM stand-in
with the openai SDK, recorded (asked and used), and checked by compile on recorded calls."""

from __future__ import annotations

import httpx
import openai
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from harnessrl.compiler.pipeline import CompileOptions, Compiler
from harnessrl.db import open_db
from harnessrl.errors import UserError
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, unpack_ids
from harnessrl.sampling_policy import SamplingPolicy, apply, load_policy, parse_policy, violations

POLICY = "temperature: 1.0\ntop_p: 1.0\nmax_tokens: 4\nforbid: [logit_bias]\ndefaults: {seed: 7}\n"


@pytest.mark.unit
def test_apply_overrides_caps_removes_and_defaults_and_says_what_changed():
    p = parse_policy({"temperature": 1.0, "top_p": 1.0, "max_tokens": 64, "forbid": ["logit_bias"],
                      "defaults": {"seed": 7}})
    body = {"messages": [], "temperature": 0.2, "max_tokens": 500, "logit_bias": {"5": 10}, "seed": 1}
    out, changed = apply(p, body)
    assert out == {"messages": [], "temperature": 1.0, "top_p": 1.0, "max_tokens": 64, "seed": 1}
    assert changed == {"temperature": {"asked": 0.2, "used": 1.0}, "top_p": {"asked": None, "used": 1.0},
                       "max_tokens": {"asked": 500, "used": 64}, "logit_bias": {"asked": {"5": 10}, "used": None}}
    assert body["temperature"] == 0.2  # the harness's body is left as it was
    # on-policy already: nothing changes; an absent cap is set
    out, changed = apply(p, {"temperature": 1.0, "top_p": 1.0, "max_completion_tokens": 10, "seed": 3})
    assert changed == {} and out["max_completion_tokens"] == 10
    assert apply(p, {"temperature": 1.0, "top_p": 1.0})[0]["max_tokens"] == 64
    assert violations(p, out) == []
    assert violations(p, body) == ["temperature=0.2 (policy 1.0)", "max_tokens=500 (policy at most 64)",
                                   "logit_bias sent (forbidden)"]
    assert violations(p, {"temperature": 1.0, "top_p": 1.0}) == ["max_tokens unset (policy at most 64)"]
    assert violations(SamplingPolicy(temperature=1.0), {}) == []  # absent: the API's default, 1.0


@pytest.mark.unit
def test_reject_refuses_a_sent_value_but_sets_an_absent_one():
    from harnessrl.sampling_policy import PolicyViolation

    p = parse_policy({"temperature": 1.0, "on_violation": "reject"})
    assert apply(p, {})[0] == {"temperature": 1.0}
    with pytest.raises(PolicyViolation) as err:
        apply(p, {"temperature": 0.0})
    assert err.value.param == "temperature" and "must be 1.0" in str(err.value)


@pytest.mark.unit
@pytest.mark.parametrize("data, msg", [
    ({"temprature": 1.0}, "unknown key(s) temprature"),
    ({"temperature": "hot"}, "temperature must be a number"),
    ({"max_tokens": 0}, "max_tokens must be a positive integer"),
    ({"forbid": "logit_bias"}, "forbid must be a list"),
    ({"on_violation": "explode"}, "on_violation must be"),
    ([1, 2], "expected a mapping"),
])
def test_bad_policy_files_are_one_line_errors(data, msg):
    with pytest.raises(UserError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        parse_policy(data)


def _calls(db: str) -> list[Call]:
    engine, Session = open_db(db)
    with Session() as s:
        rows = list(s.scalars(select(Call).order_by(Call.created_at)))
    engine.dispose()
    return rows


def test_proxy_enforces_and_records_the_policy_and_compile_drops_off_policy_calls(upstream, tokenizer_dir,
                                                                                   tmp_path):
    db = str(tmp_path / "runs.db")
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    msgs = [{"role": "user", "content": "Where is the river?"}]
    asked = dict(temperature=0.2, max_tokens=50, logit_bias={"5": 10})
    for rid, enforced in (("off", False), ("on", True)):  # one rollout recorded before the policy, one with it
        cfg = ProxyConfig(db=db, upstream=upstream, port=0, sampling_policy=str(policy_file) if enforced else None)
        with run_proxy(cfg) as proxy:
            httpx.post(f"{proxy.url}/harnessrl/rollouts", json={"id": rid, "task_id": "t", "group_id": "g"})
            client = openai.OpenAI(base_url=f"{proxy.url}/r/{rid}/a/solo/v1", api_key="x", max_retries=0)
            answer = client.chat.completions.create(model="m", messages=msgs, **asked)
            httpx.post(f"{proxy.url}/harnessrl/rollouts/{rid}/reward", json={"value": 1.0 if enforced else 0.0})
            httpx.post(f"{proxy.url}/harnessrl/rollouts/{rid}/finish")
        # the cap reached the upstream: the stand-in cut its answer at 4 tokens
        assert answer.choices[0].finish_reason == ("length" if enforced else "stop")
    off, on = _calls(db)
    assert len(unpack_ids(on.completion_ids)) == 4 and len(unpack_ids(off.completion_ids)) > 4
    assert {k: on.request.get(k) for k in ("temperature", "top_p", "max_tokens", "logit_bias", "seed")} == \
        {"temperature": 1.0, "top_p": 1.0, "max_tokens": 4, "logit_bias": None, "seed": 7}
    assert on.request["harnessrl_sampling"] == {
        "temperature": {"asked": 0.2, "used": 1.0}, "top_p": {"asked": None, "used": 1.0},
        "max_tokens": {"asked": 50, "used": 4}, "logit_bias": {"asked": {"5": 10}, "used": None},
        "seed": {"asked": None, "used": 7}}
    assert "harnessrl_sampling" not in off.request and off.request["temperature"] == 0.2

    policy = load_policy(policy_file)
    for action, expect in (("drop", {"on"}), ("flag", {"on", "off"}), ("mask", {"on", "off"})):
        out = tmp_path / action
        stats = Compiler(db, CompileOptions(out=out, tokenizer=str(tokenizer_dir), sampling_policy=policy,
                                            policy_action=action, missing_outcome="zero")).run()
        rows = {r["rollout_id"]: r for r in pq.read_table(out / "samples.parquet").to_pylist()}
        t = stats["totals"]
        assert set(rows) == expect and t["policy_violations"] == 1
        assert (t["policy_dropped"], t["policy_flagged"], t["policy_masked"]) == {
            "drop": (1, 0, 0), "flag": (0, 1, 0), "mask": (0, 0, 1)}[action]
        if action == "mask":
            assert sum(rows["off"]["loss_mask"]) == 0 and sum(rows["on"]["loss_mask"]) > 0
        assert stats["policy_violations"][off.id][0] == "temperature=0.2 (policy 1.0)"


def test_policy_reject_is_a_400_naming_the_parameter(upstream, tmp_path):
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("temperature: 1.0\non_violation: reject\n")
    with run_proxy(ProxyConfig(db=str(tmp_path / "runs.db"), upstream=upstream, port=0,
                               sampling_policy=str(policy_file))) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], temperature=0)
        assert err.value.param == "temperature" and err.value.code == "sampling_policy"
        ok = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert ok.choices[0].message.content
